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
        dict(input_ids=[[5], [6, 7]], top_logprobs_num=[0, 20], return_logprob=True),
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
    ]
    msg = validation_message(errors)
    assert msg == "max_tokens: Value error, max_tokens must be positive (got 0)"


@pytest.mark.parametrize(
    "body,pos,want",
    [
        (
            b'{"text": "a", "sampling_params": {"temperature": NaN}}',
            49,
            "temperature = NaN is not a JSON number",
        ),
        (b'{"prompt": "a", "top_p": -Infinity}', 26, "top_p = -Infinity is not a JSON number"),
        (b'{"input_ids": [1, Infinity]}', 18, "input_ids = Infinity is not"),
        (b"{not json", 1, "the body is not valid JSON at byte 1: unexpected character"),
    ],
)
def test_validation_message_names_the_field_of_a_non_number(body, pos, want):
    """orjson (SGLang's request decoder) stops at a NaN / Infinity; FastAPI reports only the
    byte offset ("57: JSON decode error"); the message names the field."""
    import orjson

    from sglang_dsv41.sglang.guard_hooks import validation_message

    with pytest.raises(orjson.JSONDecodeError) as e:
        orjson.loads(body)
    assert e.value.pos == pos
    err = {
        "type": "json_invalid",
        "loc": ("body", pos),
        "msg": "JSON decode error",
        "input": {},
        "ctx": {"error": "unexpected character"},
    }
    assert validation_message([err], body).startswith(want)


@pytest.mark.parametrize(
    "body,want",
    [
        (
            {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "4"}},
            'sampling_params.max_new_tokens: invalid type: string "4", expected an integer',
        ),
        ({"input_ids": [1, "2"]}, 'input_ids: invalid type: string "2", expected an integer'),
        (
            {"text": "a", "sampling_params": {"temperature": "x"}},
            "sampling_params.temperature: invalid type: string",
        ),
        ({"text": "a", "top_logprobs_num": "3"}, "top_logprobs_num: invalid type"),
    ],
)
def test_contract_errors_name_the_field(body, want):
    """SGLang's /generate schema check (api_contract) says what is wrong, not where."""
    from sglang.srt.entrypoints.api_contract import generate_contract_error

    from sglang_dsv41.sglang.guard_hooks import contract_field

    error = generate_contract_error(body)
    assert error is not None and "expected" in error
    assert contract_field(body, error, generate_contract_error).startswith(want)


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


# --- caps, fan-out, batch lists, non-token inputs, stop patterns, seeds ------------------------


def test_top_logprobs_capped_by_the_server_then_the_vocabulary():
    from sglang_dsv41.request_rules import Caps

    p = Prompt(ids=[5], top_logprobs_num=21)
    _rejects(check_prompt, p, LIM, match=r"top_logprobs_num = 21 .*\[0, 20\].*max-top-logprobs")
    _rejects(check_prompt, p, LIM, COMPLETIONS, match="logprobs = 21")
    check_prompt(Prompt(ids=[5], top_logprobs_num=20), LIM)
    wide = Limits(vocab_size=512, context_len=4096, caps=Caps(max_top_logprobs=100000))
    check_prompt(Prompt(ids=[5], top_logprobs_num=512), wide)
    _rejects(check_prompt, Prompt(ids=[5], top_logprobs_num=513), wide, match="vocabulary")


@pytest.mark.parametrize(
    "prompts,n,names,match",
    [
        (1, 100000, GENERATE, r"sampling_params.n = 100000 asks for 100000 sequences.*at most 64"),
        (1, 65, COMPLETIONS, r"^n = 65 asks for 65 sequences"),
        (20000, 1, GENERATE, r"20000 prompts x sampling_params.n = 1 asks for 20000"),
        (16, 8, CHAT, r"16 prompts x n = 8 asks for 128"),
        (1, 0, COMPLETIONS, r"n = 0 must be an integer >= 1"),
        (1, -2, CHAT, r"n = -2 must be"),
        (1, "2", GENERATE, r"sampling_params.n = '2' must be"),
        (1, 2.0, GENERATE, r"= 2.0 must be"),
    ],
)
def test_fanout_refused(prompts, n, names, match):
    from sglang_dsv41.request_rules import Caps, check_fanout

    _rejects(check_fanout, prompts, n, Caps(), names, match=match)


def test_fanout_accepted_up_to_the_cap():
    from sglang_dsv41.request_rules import Caps, check_fanout

    for prompts, n in ((1, None), (1, 64), (64, 1), (8, 8), (2, 3)):
        check_fanout(prompts, n, Caps(), GENERATE)
    check_fanout(1, 500, Caps(max_n=500), GENERATE)


def test_n_of_generate_reads_sglangs_place():
    from sglang_dsv41.request_rules import n_of_generate

    assert n_of_generate(_generate(sampling_params={"n": 3})) == 3
    assert n_of_generate(_generate(sampling_params=[{"n": 4}, {"n": 4}])) == 4
    assert n_of_generate(_generate()) == 1


@pytest.mark.parametrize(
    "fields,match",
    [
        (
            dict(input_ids=[[5], [6], [7]], sampling_params=[{}, {}]),
            r"sampling_params has 2 entries for a batch of 3 prompts",
        ),
        (dict(text=["a", "b"], return_logprob=[True]), r"return_logprob has 1 entries"),
        (dict(text=["a", "b"], top_logprobs_num=[1, 2, 3]), r"top_logprobs_num has 3 entries"),
        (dict(text=["a", "b"], rid=["x"]), r"rid has 1 entries"),
        (dict(input_ids=[[5], [6]], token_ids_logprob=[[1]]), r"token_ids_logprob has 1 lists"),
        (dict(input_ids=[5], sampling_params=[{}]), r"sampling_params is a list for a single"),
    ],
)
def test_batch_lists_must_match_the_prompts(fields, match):
    _rejects(prompts_of_generate, _generate(**fields), match=match)


def test_batch_lists_accepted():
    ok = [
        dict(input_ids=[[5], [6]], sampling_params=[{}, {"max_new_tokens": 3}]),
        dict(text=["a", "b"], sampling_params={"max_new_tokens": 3}, return_logprob=True),
        dict(input_ids=[[5], [6]], token_ids_logprob=[1, 2, 3]),
        dict(input_ids=[5], sampling_params={"n": 2}),
    ]
    for fields in ok:
        prompts_of_generate(_generate(**fields))


def test_embedding_inputs_refused_by_name():
    from sglang_dsv41.request_limits import SCORE_EMBEDDING_INPUTS, check_token_inputs_only

    for value in ({"a": 1}, [1, 2], "x", 0):
        obj = SimpleNamespace(input_embeds=None, positional_embed_overrides=value)
        _rejects(check_token_inputs_only, obj, match="positional_embed_overrides is not")
    _rejects(check_token_inputs_only, {"input_embeds": [[0.1]]}, match="input_embeds is not")
    _rejects(check_token_inputs_only, {"image_data": "x.png"}, match="image_data is not")
    check_token_inputs_only(SimpleNamespace(input_embeds=None, positional_embed_overrides=None))
    check_token_inputs_only({"prompt": "x"})
    score = SimpleNamespace(
        embed_override_token_id=None, query_embed_overrides=[[0.1]], item_embed_overrides=None
    )
    _rejects(check_token_inputs_only, score, SCORE_EMBEDDING_INPUTS, match="query_embed_overrides")


def test_stop_regex_must_compile():
    from sglang_dsv41.request_limits import check_stop_regex

    check_stop_regex(None, "stop_regex")
    check_stop_regex(["a+", r"\d{3}"], "stop_regex")
    _rejects(check_stop_regex, "(", "sampling_params.stop_regex", match=r"stop_regex = '\(' is not")
    _rejects(check_stop_regex, ["a", "[b"], "stop_regex", match=r"stop_regex\[1\] = '\[b'")
    _rejects(check_stop_regex, [3], "stop_regex", match=r"stop_regex\[0\] = 3 must be")


@pytest.mark.parametrize(
    "seed,deterministic,match",
    [
        (7, False, r"seed = 7: seeds are honoured only .*--enable-deterministic-inference"),
        (2**63, True, r"seed = 9223372036854775808 must be an integer in \[-2\^63, 2\^63\)"),
        ("7", True, r"seed = '7' must be an integer"),
        (True, True, r"seed = True must be an integer"),
    ],
)
def test_seed_refused(seed, deterministic, match):
    from sglang_dsv41.request_rules import check_seed

    _rejects(check_seed, seed, deterministic, "seed", match=match)


def test_seed_accepted():
    from sglang_dsv41.request_rules import check_seed

    check_seed(None, False, "seed")
    for seed in (0, 7, -1, -(2**63), 2**63 - 1):
        check_seed(seed, True, "seed")


def test_choice_seeds_differ_and_choice_zero_is_the_request_seed():
    from sglang_dsv41.request_rules import choice_seed

    for seed in (0, 7, -5, 2**63 - 1, -(2**63)):
        seeds = [choice_seed(seed, k) for k in range(64)]
        assert seeds[0] == seed
        assert len(set(seeds)) == 64
        assert all(-(2**63) <= s < 2**63 for s in seeds)
        assert seeds == [choice_seed(seed, k) for k in range(64)]


def test_hook_targets_resolve_in_the_installed_sglang():
    """Every HookRegistry target of these guards names an existing SGLang attribute, so a
    renamed one fails here rather than silently in a server (HookRegistry only logs it)."""
    import pkgutil

    from sglang_dsv41.sglang import access, deterministic, guard_hooks, server_flags

    targets = [
        v
        for mod in (access, deterministic, guard_hooks, server_flags)
        for k, v in vars(mod).items()
        if k.startswith("_") and k.isupper() and isinstance(v, str) and v.startswith("sglang.")
    ]
    assert len(targets) >= 14, targets
    for target in targets:
        assert pkgutil.resolve_name(target) is not None, target
