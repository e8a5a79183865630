import random

import pytest
import torch

from rstitch.errors import ConfigError
from rstitch.scorers import PRMS, check_prm_spec, load_prm
from rstitch.scorers.hf_prm import QwenMathPRM, SkyworkPRM
from rstitch.scorers.likelihood_prm import CheckedValues, LikelihoodHead, TestbedPRM, fit_head, save_prm
from rstitch.scorers.oracle import OracleStepChecker, parse_problem
from rstitch.testbed import check_steps, corrupt_steps, first_wrong_step, generate_problems

PROBLEM = "What is 3 + 4 * 2?"
STEPS = ["4 * 2 = 8", "3 + 8 = 11", "so the answer is 11", "check: 11 - 8 = 3"]


def tiny_config(cls_name, tok, **extra):
    import transformers

    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None, **extra,
    )
    return getattr(transformers, cls_name)(cfg).eval()


@pytest.fixture(scope="module")
def char_tokenizer(tiny_pair):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_pair["tokenizer"])


@pytest.fixture(scope="module")
def testbed_style_prm(tmp_path_factory, char_tokenizer):
    """A likelihood PRM directory around a tiny random causal LM."""
    path = tmp_path_factory.mktemp("prm")
    model = tiny_config("LlamaForCausalLM", char_tokenizer)
    save_prm(path, model, char_tokenizer, LikelihoodHead(weight=[0.5, 0.25], bias=2.0))
    return path, model


def full_forward(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def checked_logprob(model, tok, ids, t):
    """By hand: the log-probability of the written token ids[t] among the tokens of its kind."""
    digits = [tok.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
    ops = [tok.encode(o, add_special_tokens=False)[0] for o in "+-*"]
    kind = digits if ids[t] in digits else ops if ids[t] in ops else None
    if kind is None:
        return 0.0
    logp = full_forward(model, ids[:t]).log_softmax(-1)[-1]
    return float(logp[ids[t]] - logp[kind].logsumexp(-1))


def test_testbed_prm_is_a_logistic_head_on_the_lowest_checked_probabilities(testbed_style_prm, char_tokenizer):
    path, model = testbed_style_prm
    prm = TestbedPRM(str(path))
    ids = char_tokenizer.encode(PROBLEM + "\n", add_special_tokens=False)
    start, expected, running = len(ids), [], 0.0
    for s in STEPS:
        step_ids = char_tokenizer.encode(s + "\n\n", add_special_tokens=False)
        ids += step_ids
        step_min = min(max(-20.0, checked_logprob(model, char_tokenizer, ids, t)) for t in range(len(ids) - len(step_ids), len(ids)))
        running = min(running, step_min)
        expected.append(torch.sigmoid(torch.tensor(0.5 * running + 0.25 * step_min + 2.0)).item())
    scores = prm.score(PROBLEM, STEPS)
    assert start == len(PROBLEM) + 1 and len(scores) == len(STEPS) and all(0.0 <= s <= 1.0 for s in scores)
    assert scores == pytest.approx(expected, abs=1e-5)
    assert max(scores) - min(scores) > 1e-4  # the written digits matter
    assert prm.score(PROBLEM, ["no digits here"]) == pytest.approx([torch.sigmoid(torch.tensor(2.0)).item()], abs=1e-6)


def test_hf_prm_is_causal_and_reuses_the_shared_prefix(testbed_style_prm):
    path, model = testbed_style_prm
    prm = TestbedPRM(str(path))
    full = TestbedPRM(str(path)).score(PROBLEM, STEPS)
    for k in range(1, len(STEPS)):
        torch.testing.assert_close(torch.tensor(prm.score(PROBLEM, STEPS[:k])), torch.tensor(full[:k]), rtol=1e-4, atol=1e-5)
    before = prm.cost.tokens_processed
    assert prm.score(PROBLEM, STEPS)[-1] == pytest.approx(full[-1], abs=1e-5)
    assert prm.cost.tokens_processed - before == len(STEPS[-1] + "\n\n")  # only the new step ran
    # A different last step rolls back to the shared prefix.
    before = prm.cost.tokens_processed
    prm.score(PROBLEM, STEPS[:2] + ["x"])
    assert prm.cost.tokens_processed - before == len("x\n\n")
    assert prm.num_parameters == sum(p.numel() for p in model.parameters())


def test_likelihood_head_round_trips_and_refuses_bad_files(tmp_path, char_tokenizer):
    head = LikelihoodHead(weight=[1.5, -0.5], bias=0.25, floor=-10.0)
    head.save(tmp_path)
    assert LikelihoodHead.load(tmp_path) == head
    with pytest.raises(ConfigError, match="no prm_head.json"):
        LikelihoodHead.load(tmp_path / "missing")
    with pytest.raises(ConfigError, match="expected 2 weights"):
        LikelihoodHead(weight=[1.0])
    with pytest.raises(ConfigError, match="not a single token"):
        CheckedValues(LikelihoodHead(kinds={"word": ["Start"]}), char_tokenizer)


def test_fitted_head_orders_steps_by_their_features():
    # Wrong steps have low minima: the fitted head must score them below right ones.
    gen = torch.Generator().manual_seed(0)
    right = -torch.rand(200, 2, generator=gen)
    wrong = -3.0 - 5.0 * torch.rand(200, 2, generator=gen)
    head = LikelihoodHead()
    fit_head(torch.cat([right, wrong]), torch.cat([torch.ones(200), torch.zeros(200)]), head)
    assert head.weight[0] > 0 and head.score(right).min() > head.score(wrong).max()


def test_skywork_prm_uses_the_value_head_from_the_checkpoint(tmp_path, char_tokenizer):
    from safetensors.torch import load_file, save_file

    # A Llama backbone stands in for Qwen2 (AutoModel loads either; a qwen2 config would make
    # AutoTokenizer swap the character tokenizer for Qwen2's).
    causal = tiny_config("LlamaForCausalLM", char_tokenizer)
    causal.save_pretrained(tmp_path)
    char_tokenizer.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    head_w, head_b = torch.randn(1, 32), torch.randn(1)
    save_file({**weights, "v_head.summary.weight": head_w, "v_head.summary.bias": head_b},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    prm = SkyworkPRM(str(tmp_path), dtype="float32")

    sep = char_tokenizer.encode("\n\n", add_special_tokens=False)[-1]
    ids, ends = char_tokenizer.encode(PROBLEM + "\n", add_special_tokens=False), []
    for s in STEPS:
        ids += char_tokenizer.encode(s, add_special_tokens=False) + [sep]
        ends.append(len(ids) - 1)
    with torch.no_grad():
        hidden = causal.model(torch.tensor([ids])).last_hidden_state[0]
    expected = torch.sigmoid(hidden[ends] @ head_w.T + head_b)[:, 0]
    torch.testing.assert_close(torch.tensor(prm.score(PROBLEM, STEPS)), expected, rtol=1e-4, atol=1e-5)
    assert prm.score(PROBLEM, STEPS[:2]) == pytest.approx(expected[:2].tolist(), abs=1e-5)


def test_skywork_prm_without_value_head_is_a_clear_error(tmp_path, char_tokenizer):
    tiny_config("LlamaForCausalLM", char_tokenizer).save_pretrained(tmp_path)
    char_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="value head"):
        SkyworkPRM(str(tmp_path), dtype="float32")


@pytest.mark.parametrize("use_cache", [True, False])
def test_qwen_math_prm_reads_the_positive_class_at_each_marker(tmp_path, char_tokenizer, use_cache):
    from transformers import AutoTokenizer

    char_tokenizer.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.add_tokens(["<extra_0>"], special_tokens=True)
    model = tiny_config("LlamaForTokenClassification", tok, num_labels=2)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prm = QwenMathPRM(str(tmp_path), dtype="float32", auto_class="AutoModelForTokenClassification",
                      trust_remote_code=False, use_cache=use_cache)

    text = tok.apply_chat_template(
        [{"role": "system", "content": prm.system}, {"role": "user", "content": PROBLEM},
         {"role": "assistant", "content": "".join(s + "<extra_0>" for s in STEPS)}], tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    marker = tok.convert_tokens_to_ids("<extra_0>")
    positions = [i for i, t in enumerate(ids) if t == marker]
    expected = torch.softmax(full_forward(model, ids)[positions], dim=-1)[:, 1]
    torch.testing.assert_close(torch.tensor(prm.score(PROBLEM, STEPS)), expected, rtol=1e-4, atol=1e-5)
    assert prm.score(PROBLEM, STEPS[:3]) == pytest.approx(expected[:3].tolist(), abs=1e-5)


def test_oracle_parses_testbed_problems_back():
    for problem in generate_problems("test", 20, seed=3):
        parsed = parse_problem(problem.problem)
        assert (parsed.start, parsed.ops, parsed.answer) == (problem.start, problem.ops, problem.answer)
    for text in ("What is 2 + 2?", "Start with 5. Divide by 2. What is the result?"):
        with pytest.raises(ConfigError, match="testbed problems only"):
            parse_problem(text)


def test_shipped_testbed_prm_refuses_other_benchmarks():
    with pytest.raises(ConfigError, match="testbed problems only"):
        load_prm("testbed").score("What is 2 + 2?", ["2 + 2 = 4"])


def test_oracle_scores_correct_steps_one_and_wrong_steps_zero():
    oracle, rng = OracleStepChecker(), random.Random(0)
    for problem in generate_problems("validation", 10, seed=1):
        for style in ("concise", "verbose"):
            assert oracle.score(problem.problem, problem.steps(style)) == [1.0] * len(problem.steps(style))
            bad = corrupt_steps(problem, style, rng)
            scores = oracle.score(problem.problem, bad)
            wrong = first_wrong_step(problem, bad)
            assert wrong is not None and scores[wrong] == 0.0 and scores[:wrong] == [1.0] * wrong
            for k in range(1, len(bad)):
                assert oracle.score(problem.problem, bad[:k]) == scores[:k]
    assert oracle.num_parameters == 0 and oracle.cost.tokens_processed == 0 and oracle.cost.forward_calls > 0


def test_prm_registry_fails_loudly_with_valid_names():
    with pytest.raises(ConfigError) as err:
        load_prm("nope")
    assert all(name in str(err.value) for name in PRMS)
    with pytest.raises(ConfigError):
        check_prm_spec({"path": "x"}, "rsd")
    with pytest.raises(ConfigError, match="PRM 'oracle'"):
        load_prm("oracle", bogus=1)
    assert isinstance(load_prm("oracle"), OracleStepChecker)


def test_a_type_error_inside_a_prm_constructor_is_not_a_config_error(monkeypatch):
    """Arguments are checked by signature; a bug raised while constructing propagates as itself."""
    def broken_init(self) -> None:
        raise TypeError("a bug inside the constructor")

    monkeypatch.setattr(OracleStepChecker, "__init__", broken_init)
    with pytest.raises(TypeError, match="a bug inside the constructor"):
        load_prm("oracle")
    with pytest.raises(ConfigError, match="PRM .oracle.*bogus"):
        load_prm("oracle", bogus=1)


def test_shipped_testbed_prm_ranks_right_steps_above_wrong_ones():
    # Clean and corrupted solutions of test problems in both styles, and a style mixture: the
    # shipped PRM judges the digits, not the style, so one ranking covers them all.
    prm, rng = load_prm("testbed"), random.Random(0)
    good, bad = [], []
    for problem in generate_problems("test", 12, seed=5):
        for style in ("verbose", "concise"):
            for steps in (problem.steps(style), corrupt_steps(problem, style, rng)):
                for score, ok in zip(prm.score(problem.problem, steps), check_steps(problem, steps)):
                    (good if ok else bad).append(score)
    pairs = [(g > b) + 0.5 * (g == b) for g in good for b in bad]
    assert sum(pairs) / len(pairs) > 0.9  # ROC-AUC of right vs wrong steps


def test_llm_judge_reads_yes_against_no_at_the_last_position_through_the_engine(tmp_path, char_tokenizer):
    from transformers import AutoTokenizer

    from rstitch.scorers.judge_prm import LLMJudgePRM

    char_tokenizer.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.add_tokens(["Yes", "No"])
    model = tiny_config("LlamaForCausalLM", tok)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # answers far from 1/2
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    judge = LLMJudgePRM(str(tmp_path))
    yes, no = tok.convert_tokens_to_ids(["Yes", "No"])
    expected = []
    for k in range(1, len(STEPS) + 1):
        logits = full_forward(model, judge.prompt_ids(PROBLEM, STEPS[:k]))[-1]
        expected.append(float(torch.softmax(logits[[yes, no]], -1)[0]))
    scores = judge.score(PROBLEM, STEPS)
    assert scores == pytest.approx(expected, abs=1e-5) and max(scores) - min(scores) > 1e-3
    assert judge.num_parameters == sum(p.numel() for p in model.parameters())
    # A new step costs the tokens after the prefix its prompt shares with the last call, in one forward.
    before = judge.cost.copy()
    judge.score(PROBLEM, STEPS + ["so 11 it is"])
    spent = judge.cost.since(before)
    old, new = judge.prompt_ids(PROBLEM, STEPS), judge.prompt_ids(PROBLEM, STEPS + ["so 11 it is"])
    shared = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    assert (spent.forward_calls, spent.tokens_processed) == (1, len(new) - shared)


@pytest.mark.parametrize("engine,expected", [("hf", "hf"), ("llamacpp", "llamacpp"), ("vllm", "hf")])
def test_the_stand_in_judge_runs_on_the_runs_engine_with_its_threads(engine, expected):
    """prm=llm_judge is the pair's LLM: it scores on the run's engine and threads (on llama.cpp it once
    ran on the HF engine with the single torch thread that engine leaves, twice RSD's latency);
    vLLM's default logprobs are not the full vocabulary it reads, so there it stays on hf."""
    from rstitch.config_groups import compose_config

    cfg = compose_config(["pair=testbed", "prm=llm_judge", f"engine={engine}", "engine.num_threads=3", "method=rsd"])
    assert (cfg["method"]["prm"]["engine"], cfg["method"]["prm"]["num_threads"]) == (expected, 3)


def test_the_stand_in_judge_passes_its_engine_and_threads_to_the_scoring_model(monkeypatch):
    import rstitch.scorers.judge_prm as judge_prm

    seen = []

    def capture(engine, path, user, needs=(), **options):
        seen.append((engine, needs, options))
        raise ConfigError("captured")

    monkeypatch.setattr(judge_prm, "load_scoring_model", capture)
    for threads in (3, None):
        with pytest.raises(ConfigError, match="captured"):
            judge_prm.LLMJudgePRM("some/model", engine="llamacpp", num_threads=threads)
    assert seen == [("llamacpp", ("exact_distributions",), {"dtype": "float32", "device": "cpu", "num_threads": 3}),
                    ("llamacpp", ("exact_distributions",), {"dtype": "float32", "device": "cpu", "num_threads": None})]
