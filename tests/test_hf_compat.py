"""The KV-cache argument name differs across transformers 5.x; a wrong one is silently ignored."""

from testkit import tiny_qwen3

from dflash_train.hf_compat import cache_kwarg


class _Old:
    def forward(self, input_ids, past_key_values=None, **kwargs):
        return past_key_values


class _New:
    def forward(self, input_ids, cache=None, **kwargs):
        return cache


def test_cache_kwarg_follows_the_signature():
    assert cache_kwarg(_Old()) == "past_key_values"
    assert cache_kwarg(_New()) == "cache"
    model = tiny_qwen3(num_layers=1)
    name = cache_kwarg(model)
    assert name in ("cache", "past_key_values")
    import inspect

    assert name in inspect.signature(model.forward).parameters
