# The CPU-trained drafter served by llama.cpp (2026-12-05, 2-core CPU machine, quiet but for these commands).
# Data: the first committed answer set (docs/results/data/greedy-answers-1.tar.xz, unpacked to runs/cpu1h/greedy-1.jsonl);
# decontamination on (the default): 15 records dropped as eval_prompt.
set -e
dflash-train train cpu-demo 'data.paths=[runs/cpu1h/greedy-1.jsonl]' train.run_dir=runs/cpu1h/run \
    train.time_budget_minutes=60 eval.prompts=null train.log_every=50 train.max_steps=100000 data.trim_loops=true
dflash-train llama-cpp convert assets/smollm2 runs/target.gguf --outtype f32   # the target, once
dflash-train export runs/cpu1h/run runs/cpu1h/drafter --dtype float32 --gguf runs/target.gguf
dflash-train eval --engine llama.cpp --target assets/smollm2 --drafter runs/cpu1h/drafter --target-gguf runs/target.gguf \
    --prompts heldout --limit 24 --max-new-tokens 64 --threads 2 --out runs/cpu1h/eval24
