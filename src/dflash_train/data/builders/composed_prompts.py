"""Prompts composed from hand-written request templates, for the target to answer.

Why: the drafter learns to imitate the target on the prompts it is trained on, and the prompts
SmolLM2-135M writes for itself (``prompts.synthesize``) are often not requests at all ("What would
you like to ask, a curious student?", "Please paste the instruction..."): their answers are short,
evasive or restate the prompt, unlike the answers a user's direct request gets. A template is a
request as a person types it, in one of many intents (explain, instruct, advise, compare, list,
create, rewrite, summarize, classify, code, calculate, plan, ...), with slots filled from topic and
filler lists, so the target answers real requests across many subjects and forms.

Nothing here is drawn from the never-trained prompt sets: the templates follow a general taxonomy
of assistant requests, and ``PromptSet`` refuses any composed prompt equal or near to one of those
sets' prompts (``prompts.near_key``).

    dflash-train prompts --out prompts.jsonl --no-seeds --num-composed 60000
"""

from __future__ import annotations

import random

from .prompts import TOPICS

# things that work in some way (how does X work / why does X ...)
MECHANISMS = [
    "a microwave oven", "a dishwasher", "a thermostat", "an electric motor",
    "a touchscreen", "a GPS receiver", "a credit card payment", "a search engine",
    "a hybrid car", "a heat pump", "an elevator", "a camera lens", "a compass", "a smoke detector",
    "a water filter", "a 3D printer", "a barcode scanner", "a wind turbine", "a hydroelectric dam",
    "an induction cooktop", "a pressure cooker", "a vending machine", "a traffic light system",
    "a submarine", "a hot air balloon", "a parachute", "a rocket engine", "a lock and key",
    "a zipper", "a sewing machine", "a printer", "a hard drive", "a solid-state drive", "a router",
    "Bluetooth", "a QR code", "an LED bulb", "a fuel cell", "a lithium-ion battery", "a vaccine trial",
    "a blood test", "an MRI scanner", "a hearing aid", "a pacemaker", "a nuclear reactor",
    "a telescope", "a microscope", "a seismograph", "a barometer", "a sundial", "a mechanical watch",
    "an espresso machine", "a sourdough starter", "yeast in bread", "soap", "sunscreen", "glue",
    "a password manager", "two-factor authentication", "public-key encryption", "a spam filter",
    "a recommendation system", "a compiler", "garbage collection", "a database index", "a web browser",
    "email delivery", "a mobile phone network", "satellite internet", "a stock exchange", "a mortgage",
    "a credit score", "insurance", "a central bank", "a jury trial", "a patent", "recycling plants",
]

# skills and activities (how do I / how can I / tips for ...)
ACTIVITIES = [
    "learn to swim as an adult", "start running", "write a good essay",
    "prepare for a job interview", "negotiate a salary", "give a presentation", "learn to cook",
    "make my own bread", "grow tomatoes on a balcony", "care for a cactus", "train my dog to sit",
    "introduce a new cat to my home", "save for a vacation", "make a budget", "reduce my screen time",
    "fall asleep faster", "wake up earlier", "stay focused while studying", "memorize vocabulary",
    "learn to touch type", "start a podcast", "edit a video",
    "build a simple website", "learn Python", "set up a home network", "back up my computer",
    "speed up a slow laptop", "clean my keyboard", "iron a shirt",
    "fold a fitted sheet", "pack a suitcase efficiently", "plan a road trip", "travel with a toddler",
    "apologize to a friend", "deal with a difficult coworker",
    "ask for help at work", "say no politely", "handle criticism", "manage my time", "stop procrastinating",
    "start journaling", "meditate", "calm down before an exam", "prepare for a marathon",
    "do a proper push-up", "stretch after a workout", "eat more vegetables", "drink less coffee",
    "cook rice without a rice cooker", "sharpen a kitchen knife", "brew good tea", "host a dinner party",
    "store fresh herbs", "organize my desk", "declutter my bedroom",
    "paint a wall", "hang a picture straight", "fix a squeaky door", "unclog a drain",
    "jump-start a car", "check my tire pressure", "learn chess openings", "solve a Rubik's cube",
    "learn to juggle", "knit a scarf", "draw a face", "write a song", "read music", "tune a guitar",
    "update my resume", "prepare my taxes", "open a savings account",
    "choose a laptop for school", "protect my privacy online", "spot a phishing email",
]

# things to create (write a ... about ...)
CREATIONS = [
    ("a short poem", ["the ocean at night", "a city waking up", "a lost umbrella", "friendship",
                      "the first snow", "an old bookstore", "a cup of coffee", "the moon", "a garden in spring",
                      "a long train journey", "a lighthouse", "a rainy Monday"]),
    ("a haiku", ["a cat sleeping", "mountains", "the wind", "a candle", "a river", "city lights",
                 "fallen snow", "a frog in a pond"]),
    ("a short story", ["a dragon who is afraid of fire", "a girl who finds a map in the attic",
                       "a time traveler stuck in 1850", "two strangers on a delayed flight",
                       "a detective solving a missing cake case", "a talking tree", "the last bakery in town",
                       "a robot learning to cook", "a lighthouse keeper's strange visitor"]),
    ("a limerick", ["a clumsy chef", "a cat who loves cheese", "a forgetful wizard", "a sleepy owl"]),
    ("a product description", ["wireless earbuds", "a standing desk",
                               "a scented candle", "a hiking backpack", "a smart alarm clock", "a yoga mat"]),
    ("a short speech", ["a school graduation", "a retirement party",
                        "the opening of a community garden", "a team's end-of-season dinner"]),
    ("a social media post", ["a bakery's new croissant", "a charity run", "a library's summer reading program",
                             "a new coffee shop opening", "a beach cleanup event"]),
    ("a joke", ["programmers", "cats", "math teachers", "the weather", "coffee"]),
    ("a riddle", ["time", "a shadow", "an echo", "a key"]),
    ("a dialogue", ["a customer and a waiter", "a teacher and a student who forgot homework",
                    "two astronauts on Mars", "a parent and a teenager about chores"]),
    ("a motivational quote", ["starting over", "hard work", "learning from mistakes"]),
    ("a song chorus", ["summer holidays", "missing home", "a road trip with friends"]),
]

# messages to write (write an email / a message / a letter ...)
MESSAGES = [
    "an email to my landlord about a broken heater", "a message asking my manager for a day off",
    "a note to my neighbor about a package",
    "an email to a professor asking for an extension", "a letter of recommendation for a former intern",
    "a complaint email about a late delivery", "an out-of-office reply",
    "a message inviting friends to a picnic", "a polite reminder about an unpaid invoice",
    "a resignation letter", "an apology to a customer for a billing error", "a welcome email for new club members",
    "a message congratulating a colleague on a promotion", "a request to reschedule a meeting",
    "an email introducing myself to a new team", "a short condolence note", "a message asking for feedback",
    "a text to cancel plans without sounding rude",
]

AUDIENCES = ["a five-year-old", "a ten-year-old", "a teenager", "a complete beginner", "my grandmother",
             "a high school student", "someone who has never used a computer", "a busy manager", "an engineer"]

FORMATS = ["in three bullet points", "in one paragraph", "in two sentences", "step by step",
           "as a numbered list", "in simple words", "in under 100 words", "with an example", "as a short table"]

PAIRS = [
    ("cats", "dogs"), ("tea", "coffee"), ("renting", "buying a home"), ("trains", "planes"),
    ("a laptop", "a tablet"), ("running", "swimming"), ("e-books", "paper books"), ("Python", "JavaScript"),
    ("SQL", "NoSQL databases"), ("a Roth IRA", "a traditional IRA"), ("stocks", "bonds"),
    ("living in a city", "living in the countryside"), ("working from home", "working in an office"),
    ("solar power", "wind power"),
    ("mitosis", "meiosis"), ("affect", "effect"),
    ("butter", "margarine"), ("a crocodile", "an alligator"), ("a lake", "a pond"), ("TCP", "UDP"),
    ("RAM", "storage"), ("a list", "a tuple in Python"), ("HTTP", "HTTPS"), ("a debit card", "a credit card"),
    ("yoga", "pilates"), ("a cold", "the flu"), ("nuclear", "coal power"),
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the vowels in a sentence",
    "returns the n-th Fibonacci number", "finds the largest number in a list", "removes duplicates from a list",
    "checks whether a word is a palindrome", "converts Celsius to Fahrenheit", "sorts a list of names by length",
    "merges two sorted lists", "computes the factorial of a number", "counts how often each word appears in a text",
    "validates an email address", "flattens a nested list", "finds the second smallest number in a list",
    "reads a CSV file and prints the average of a column", "generates a random password",
    "checks whether two strings are anagrams", "converts a number to Roman numerals", "implements binary search",
    "finds the greatest common divisor of two numbers", "capitalizes the first letter of every word",
    "returns the sum of the digits of a number", "rotates a list by k positions", "transposes a matrix",
    "checks whether parentheses in a string are balanced", "computes a running average",
    "groups a list of words by their first letter", "finds all pairs in a list that sum to a target",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "Java", "C", "Go", "Rust", "C++", "a bash script"]

CODE_CONCEPTS = [
    "a for loop", "a while loop", "recursion", "a dictionary", "a class", "inheritance", "an exception",
    "a lambda function", "list comprehension", "a generator", "a decorator", "async and await", "a pointer",
    "a hash map", "a stack", "a queue", "a binary tree", "Big-O notation", "a REST API", "a Git branch",
    "a merge conflict", "a unit test", "a race condition", "a memory leak", "an SQL join", "a primary key",
    "a regular expression", "a virtual environment", "a Docker container", "an environment variable",
]

SNIPPETS = [
    "def add(a, b):\n    return a - b",
    "for i in range(10)\n    print(i)",
    "nums = [3, 1, 2]\nnums.sort\nprint(nums)",
    "def average(xs):\n    return sum(xs) / len(xs)",
    "x = input('Number: ')\nprint(x * 2)",
    "items = {'a': 1, 'b': 2}\nfor k, v in items:\n    print(k, v)",
    "def is_even(n):\n    if n % 2 == 0:\n        return True\n    else:\n        return False",
    "let total = 0;\nfor (let i = 0; i <= 10; i++) { total += i }\nconsole.log(total)",
    "SELECT name, COUNT(*) FROM orders GROUP BY customer_id;",
    "with open('data.txt') as f:\n    lines = f.readlines()\nprint(len(lines))",
]

SENTENCES = [
    "me and him goes to the store yesterday and buyed three apple.",
    "Their going to the park tomorrow, if it dont rain.",
    "The meeting have been moved to friday because the manager are sick.",
    "I has finished my homework but I forgetted to bring it.",
    "Can you send me the files what we discussed last week?",
    "The product is really good and I am very happy and I will buy it again and tell my friends.",
    "Our company is committed to providing customers with the best possible service at all times.",
    "The weather was nice so we decided to go to the beach and have a picnic with our friends.",
    "Due to unforeseen circumstances, the event scheduled for Saturday has been postponed.",
    "I think that maybe we should possibly consider changing the plan a little bit.",
    "The new phone has a great camera, but the battery dies before lunch.",
    "Honestly, the service was slow and the soup was cold, but the dessert saved the evening.",
    "The train was late again this morning, so I missed the first half of the lecture.",
    "Our team finished the project two days early and under budget.",
]

# short facts-style questions, filled from topics
QUESTION_TEMPLATES = [
    "What is {t}?", "Can you explain {t}?", "Tell me about {t}.", "What should I know about {t}?",
    "Why does {t} matter?", "What are the basics of {t}?", "Give me a short introduction to {t}.",
    "What are some common myths about {t}?", "What are three interesting facts about {t}?",
    "What are the most common mistakes people make with {t}?", "How did {t} develop over time?",
    "What is the history of {t} in a nutshell?", "What are the main ideas behind {t}?",
    "Explain {t} {f}.", "Explain {t} to {a}.", "How would you explain {t} to {a}?",
    "Summarize what {t} is {f}.", "I keep hearing about {t}. What is it?",
    "I'm new to {t}. Where should I start?", "What are good resources for learning about {t}?",
    "What are the pros and cons of {t}?", "What questions should I ask before getting into {t}?",
    "Write a short quiz with three questions about {t}.", "Give me a fun fact about {t}.",
    "What is a common misconception about {t}, and what is the truth?",
    "List five key terms related to {t} and define each one.",
    "How is {t} used in everyday life?", "What is the future of {t}?", "What would a beginner's guide to {t} cover?",
    "Why do people find {t} difficult?", "What are the best practices for {t}?", "Is {t} worth learning about? Why?",
    "What are the biggest debates around {t}?", "How do experts think about {t}?",
    "Write a short paragraph about {t}.", "Make a simple outline for a talk about {t}.",
    "What are the dos and don'ts of {t}?", "Give me a checklist for {t}.", "What are the key facts about {t}?",
    "How would you teach {t} in a one-hour class?", "Describe {t} {f}.", "What surprised people most about {t}?",
    "Tell me something about {t} that most people don't know.", "What is the single most important thing about {t}?",
    "Write a short FAQ about {t}.", "Which books or films would help me understand {t}?",
]

# who is asking: an optional first sentence that makes a request someone's own
PERSONAS = [
    "I'm a nurse working night shifts.", "I'm a college freshman.", "I'm retired and have a lot of free time.",
    "I'm a new parent.", "I run a small bakery.", "I'm learning English.", "I'm a high school teacher.",
    "I work in an office all day.", "I just moved to a new country.", "I'm a software developer.",
    "I'm on a tight budget.", "I have never done this before.", "I'm preparing a school project.",
    "My manager asked me about this.", "My kids keep asking me about this.", "I only have ten minutes.",
    "I'm writing a blog post.", "I'm studying for an exam.", "I live in a small apartment.", "I'm a bit nervous about it.",
]

REQUEST_TEMPLATES = [
    # mechanisms
    ("How does {m} work?", "m"), ("Explain how {m} works {f}.", "m"), ("What happens inside {m}?", "m"),
    ("Can you describe how {m} works to {a}?", "m"), ("Why was {m} invented, and how does it work?", "m"),
    ("What are the main parts of {m}?", "m"),
    # activities
    ("How do I {v}?", "v"), ("How can I {v}?", "v"), ("What's the best way to {v}?", "v"),
    ("Give me {n} tips to {v}.", "v"), ("I want to {v}. Where do I start?", "v"),
    ("Can you give me a step-by-step plan to {v}?", "v"), ("What mistakes should I avoid when I try to {v}?", "v"),
    ("I have a week to {v}. Make me a plan.", "v"), ("Explain {f} how to {v}.", "v"),
    ("My friend wants to {v}. What advice would you give?", "v"),
    # comparisons
    ("What is the difference between {p} and {q}?", "pq"), ("Compare {p} and {q}.", "pq"),
    ("Which is better, {p} or {q}? Explain.", "pq"), ("What are the pros and cons of {p} versus {q}?", "pq"),
    ("How are {p} and {q} similar, and how are they different?", "pq"),
    ("Should I choose {p} or {q}? Help me decide.", "pq"),
    # creative
    ("Write {c} about {s}.", "cs"), ("Can you write {c} about {s}?", "cs"), ("Please write {c} about {s}.", "cs"),
    ("Compose {c} about {s}.", "cs"), ("I need {c} about {s}. Keep it short.", "cs"),
    ("Write {c} about {s} for {a}.", "cs"),
    # messages
    ("Write {e}.", "e"), ("Help me write {e}.", "e"), ("Draft {e}. Keep it polite and short.", "e"),
    ("Can you write {e}? Make it friendly.", "e"), ("Write {e} in a formal tone.", "e"),
    # code
    ("Write a {l} function that {k}.", "lk"), ("How do I write code in {l} that {k}?", "lk"),
    ("Write a {l} program that {k}, and explain it.", "lk"), ("Show me {l} code that {k}.", "lk"),
    ("Can you write a function that {k}? Use {l}.", "lk"),
    ("What is {o} in programming? Give an example.", "o"), ("Explain {o} {f}.", "o"),
    ("When should I use {o}?", "o"), ("What is a common mistake with {o}?", "o"),
    ("Find the bug in this code:\n\n{x}", "x"), ("What does this code do?\n\n{x}", "x"),
    ("Can you fix this code?\n\n{x}", "x"), ("Explain this code line by line:\n\n{x}", "x"),
    ("How can I improve this code?\n\n{x}", "x"),
    # rewriting and classification of a given text
    ("Correct the grammar in this sentence: \"{g}\"", "g"), ("Rewrite this sentence to sound more formal: \"{g}\"", "g"),
    ("Make this sentence shorter: \"{g}\"", "g"), ("Rewrite this in a friendlier tone: \"{g}\"", "g"),
    ("Is the following sentence positive, negative or neutral? \"{g}\"", "g"),
    ("Translate this sentence into French: \"{g}\"", "g"), ("Translate this into Spanish: \"{g}\"", "g"),
    ("Summarize this in five words: \"{g}\"", "g"), ("Paraphrase this sentence: \"{g}\"", "g"),
]

PLANS = [
    "a three-day trip to {place}", "a weekly meal plan for a family of four", "a study schedule for final exams",
    "a 30-day fitness challenge", "a birthday party for a seven-year-old", "a small vegetable garden",
    "a reading list for the summer", "a morning routine", "a budget for a college student",
    "a team-building day for ten people", "a weekend of cleaning the house", "a beginner's workout week",
    "a surprise anniversary dinner", "a one-week trip to {place} on a budget", "a day out with kids in {place}",
]
PLACES = ["Rome", "Lisbon", "Kyoto", "Mexico City", "Cape Town", "Vancouver", "Edinburgh", "Istanbul",
          "Buenos Aires", "Seoul", "Prague", "Marrakesh", "Sydney", "Reykjavik", "Vienna", "Bangkok"]


def _math_prompt(rng: random.Random) -> str:
    """A numeric problem with fresh numbers: arithmetic, percentages, equations, rates, geometry, money."""
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
    kinds = [
        f"What is {a} times {b}?",
        f"What is {a * c} divided by {c}?",
        f"What is {rng.choice([5, 10, 15, 20, 25, 30, 40, 75])}% of {a * 10}?",
        f"Solve for x: {c}x + {a} = {c * b + a}.",
        f"A train travels {a * 10} km in {c} hours. What is its average speed?",
        f"If a shirt costs ${a} and is on sale for {rng.choice([10, 20, 25, 30, 50])}% off, what is the sale price?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        f"What is the area of a circle with a radius of {c} meters?",
        f"I have {a} apples and give away {min(a - 1, b)}. Then I buy {c} more. How many do I have?",
        f"If I save ${a} every week, how much will I have after {c} months?",
        f"Convert {a} miles to kilometers.",
        f"What is {a} squared minus {b}?",
        f"Is {a * 2 + 1} a prime number? Explain why.",
        f"Simplify the fraction {a * c}/{b * c}.",
        f"A recipe needs {c} eggs for {rng.choice([2, 4, 6])} people. How many eggs for {rng.choice([8, 10, 12])} people?",
        f"What is the average of {a}, {b} and {c}?",
        f"If {c} workers build a wall in {a} days, how long would {c * 2} workers take?",
        f"How much interest does ${a * 100} earn in {c} years at {rng.choice([2, 3, 4, 5])}% simple interest?",
        f"Round {a}.{b} to the nearest whole number and explain the rule.",
        f"What is {a + b} minus {c}, times 3?",
    ]
    return rng.choice(kinds)


def _fill(template: str, slots: str, rng: random.Random) -> str:
    values = {"f": rng.choice(FORMATS), "a": rng.choice(AUDIENCES), "n": rng.choice(["three", "five", "a few", "7"])}
    if "m" in slots:
        values["m"] = rng.choice(MECHANISMS)
    if "v" in slots:
        values["v"] = rng.choice(ACTIVITIES)
    if "pq" in slots:
        values["p"], values["q"] = rng.choice(PAIRS)
    if "cs" in slots:
        kind, subjects = rng.choice(CREATIONS)
        values["c"], values["s"] = kind, rng.choice(subjects)
    if "e" in slots:
        values["e"] = rng.choice(MESSAGES)
    if "lk" in slots:
        values["l"], values["k"] = rng.choice(LANGUAGES), rng.choice(CODE_TASKS)
    if "o" in slots:
        values["o"] = rng.choice(CODE_CONCEPTS)
    if "x" in slots:
        values["x"] = rng.choice(SNIPPETS)
    if "g" in slots:
        values["g"] = rng.choice(SENTENCES)
    return template.format(**values)


# (family, weight): the share of draws each kind of request gets; small families run out of
# distinct prompts first (``PromptSet`` refuses repeats), so the output leans to the large ones
FAMILIES = [("topic", 0.30), ("math", 0.03), ("plan", 0.04), ("request", 0.63)]


def _topic_prompt(rng: random.Random) -> str:
    template = rng.choice(QUESTION_TEMPLATES)
    return template.format(t=rng.choice(TOPICS), f=rng.choice(FORMATS), a=rng.choice(AUDIENCES))


def _plan_prompt(rng: random.Random) -> str:
    plan = rng.choice(PLANS).format(place=rng.choice(PLACES))
    return rng.choice(["Plan {x}.", "Help me plan {x}.", "Can you make {x}?", "Suggest {x}."]).format(x=plan)


def compose_prompt(rng: random.Random) -> tuple[str, str]:
    """One composed request and its source tag (``composed/<family>``); some requests for advice or
    a plan open with who is asking (``PERSONAS``)."""
    family = rng.choices([f for f, _ in FAMILIES], weights=[w for _, w in FAMILIES])[0]
    if family == "topic":
        text = _topic_prompt(rng)
    elif family == "math":
        text = _math_prompt(rng)
    elif family == "plan":
        text = _plan_prompt(rng)
    else:
        template, slots = rng.choice(REQUEST_TEMPLATES)
        text, family = _fill(template, slots, rng), slots
    if family in ("v", "plan") and rng.random() < 0.2:
        text = f"{rng.choice(PERSONAS)} {text}"
    return text, f"composed/{family}"


def add_composed(prompts, num: int, seed: int = 0, max_draws_per_prompt: int = 8) -> int:
    """Add up to ``num`` distinct composed prompts to a ``PromptSet`` (which refuses duplicates and
    anything near a never-trained prompt); returns how many were added. Drawing stops after
    ``max_draws_per_prompt * num`` draws, so asking for more than the templates hold ends."""
    rng = random.Random(f"composed-{seed}")
    added = 0
    for _ in range(max_draws_per_prompt * num):
        if added >= num:
            break
        text, source = compose_prompt(rng)
        added += prompts.add(text, source)
    return added
