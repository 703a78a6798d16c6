"""request_rules' rules on plain values, and the scheduler's last check (guard_hooks) on a
stand-in Req: each bad value is refused with a message naming the field, position and value;
good requests pass."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest

from sglang_dsv41.request_rules import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    Limits,
    Prompt,
    RequestRejected,
    check_prompt,
    check_token_ids,
    prompts_of_generate,
)

LIM = Limits(vocab_size=512, context_len=4096)


def _generate(**fields):
    base = dict(
        text=None,
        input_ids=None,
        sampling_params=None,
        return_logprob=None,
        logprob_start_len=None,
        top_logprobs_num=None,
        stream=False,
    )
    return SimpleNamespace(**{**base, **fields})


def _rejects(fn, *args, match: str):
    with pytest.raises(RequestRejected, match=match) as e:
        fn(*args)
    assert "/" not in str(e.value).replace("[0, ", "")  # no path in any message
    return str(e.value)


@pytest.mark.parametrize(
    "ids,match",
    [
        ([5, 512], r"input_ids\[1\] = 512 is outside the vocabulary"),
        ([5, 100000], r"input_ids\[1\] = 100000"),
        ([-1], r"input_ids\[0\] = -1"),
        ([5, True], r"input_ids\[1\] = True is not an integer"),
        ([5, 2.0], r"input_ids\[1\] = 2.0 is not an integer"),
        ("abc", r"input_ids must be a list"),
    ],
)
def test_token_ids_out_of_range_are_named(ids, match):
    _rejects(check_token_ids, ids, 512, "input_ids", match=match)


def test_token_ids_in_range_pass_also_as_array():
    check_token_ids([0, 511, 7], 512, "input_ids")
    check_token_ids(array("q", [0, 511]), 512, "input_ids")
    check_token_ids([], 512, "input_ids")


def test_batch_prompt_is_named_by_index():
    ps = prompts_of_generate(_generate(input_ids=[[5, 6], [7, 999]]))
    check_prompt(ps[0], LIM)
    _rejects(check_prompt, ps[1], LIM, match=r"input_ids\[1\]\[1\] = 999")


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(text="hi", input_ids=[5]), "either text or input_ids, not both"),
        (dict(text=""), "text is empty"),
        (dict(text=["a", ""]), r"text\[1\] is empty"),
        (dict(input_ids=[]), "input_ids is empty"),
        (dict(input_ids=[5] * 4096), "has 4096 tokens; the context length is 4096"),
        (dict(input_ids=[5], top_logprobs_num=513), "top_logprobs_num = 513"),
        (dict(input_ids=[5], top_logprobs_num=-1), "top_logprobs_num = -1"),
        (dict(input_ids=[[5], [6]], top_logprobs_num=[1, 600]), "top_logprobs_num = 600"),
        (
            dict(input_ids=[5], sampling_params={"stop_token_ids": [3, 7000]}),
            r"stop_token_ids\[1\] = 7000",
        ),
        (
            dict(input_ids=[5, 6], return_logprob=True, logprob_start_len=-5),
            "logprob_start_len = -5",
        ),
        (
            dict(input_ids=[5, 6], return_logprob=True, logprob_start_len=3),
            r"logprob_start_len = 3 must be -1 .* or in \[0, 2\]",
        ),
        (dict(input_ids=[5], sampling_params={"max_new_tokens": 0}), "max_new_tokens = 0"),
        (dict(input_ids=[5], sampling_params={"max_new_tokens": -2}), "max_new_tokens = -2"),
    ],
)
def test_generate_bodies_refused(fields, match):
    def run():
        for p in prompts_of_generate(_generate(**fields)):
            check_prompt(p, LIM, GENERATE)

    _rejects(run, match=match)


@pytest.mark.parametrize(
    "fields",
    [
        dict(input_ids=[5, 6], sampling_params={"max_new_tokens": 4}),
        dict(text="hello", sampling_params={"max_new_tokens": 4}),
        dict(input_ids=[[5], [6, 7]], top_logprobs_num=[0, 512], return_logprob=True),
        # 0 new tokens is SGLang's prompt-scoring request: allowed with return_logprob
        dict(
            input_ids=[5, 6],
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
        ),
        # output logprobs only: SGLang's scheduler uses start = len(prompt)
        dict(input_ids=[5, 6], return_logprob=True, logprob_start_len=2),
        # without return_logprob SGLang ignores logprob_start_len
        dict(input_ids=[5, 6], logprob_start_len=-7),
        dict(input_ids=[5] * 4095),
    ],
)
def test_generate_bodies_accepted(fields):
    for p in prompts_of_generate(_generate(**fields)):
        check_prompt(p, LIM, GENERATE)


def test_auto_truncate_takes_long_prompts():
    from dataclasses import replace

    long = Prompt(ids=[5] * 5000)
    _rejects(check_prompt, long, LIM, match="the prompt has 5000 tokens")
    check_prompt(long, replace(LIM, auto_truncate=True))


def test_openai_names_and_zero_tokens():
    p = Prompt(ids=[5, 999], max_new_tokens=2)
    _rejects(check_prompt, p, LIM, COMPLETIONS, match=r"prompt\[1\] = 999")
    p = Prompt(ids=[5], max_new_tokens=2, top_logprobs_num=600)
    _rejects(check_prompt, p, LIM, COMPLETIONS, match="logprobs = 600")
    _rejects(check_prompt, p, LIM, CHAT, match="top_logprobs = 600")
    # the OpenAI routes never take 0 new tokens, even with logprobs
    p = Prompt(ids=[5], max_new_tokens=0, return_logprob=True)
    _rejects(check_prompt, p, LIM, CHAT, match="max_tokens = 0 must be at least 1")
    check_prompt(p, LIM, GENERATE)


def test_scheduler_admission_check():
    """On SGLang's own Req, so a renamed attribute fails here rather than in a server."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    from sglang_dsv41.sglang.guard_hooks import admission_error

    def req(ids, top=0, stop=None):
        sp = SamplingParams(max_new_tokens=1, stop_token_ids=stop)
        return Req("r", "", ids, sp, return_logprob=True, top_logprobs_num=top)

    assert admission_error(req([1, 2, 3]), 512) is None
    assert admission_error(req([1, 2], top=512, stop=[3, 4]), 512) is None
    assert "input_ids[1] = 512" in admission_error(req([1, 512]), 512)
    assert "top_logprobs_num = 513" in admission_error(req([1], top=513), 512)
    assert "stop_token_ids[0] = 9999" in admission_error(req([1], stop=[9999]), 512)


def test_validation_message_has_no_source_path():
    from sglang_dsv41.sglang.guard_hooks import validation_message

    errors = [
        {
            "type": "value_error",
            "loc": ("body", "max_tokens"),
            "msg": "Value error, max_tokens must be positive",
            "input": 0,
        },
        {"type": "json_invalid", "loc": ("body", 1), "msg": "JSON decode error", "input": {}},
    ]
    msg = validation_message(errors)
    assert msg == (
        "max_tokens: Value error, max_tokens must be positive (got 0); 1: JSON decode error"
    )


def test_limits_only_for_this_architecture():
    from sglang_dsv41.sglang.guard_hooks import limits_of

    def tm(arch):
        hf = SimpleNamespace(architectures=[arch])
        mc = SimpleNamespace(hf_config=hf, vocab_size=512)
        return SimpleNamespace(model_config=mc, context_len=4096, num_reserved_tokens=0)

    assert limits_of(tm("DeepseekV41ForCausalLM")) == LIM
    assert limits_of(tm("LlamaForCausalLM")) is None


def test_openai_zero_limits_refused():
    from sglang_dsv41.request_rules import check_openai_limits

    check_openai_limits(SimpleNamespace(max_tokens=None, max_completion_tokens=3))
    for fields in (dict(max_tokens=0), dict(max_completion_tokens=0), dict(max_tokens=-1)):
        _rejects(check_openai_limits, SimpleNamespace(**fields), match="must be at least 1")
