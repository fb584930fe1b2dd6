"""The swelake_reward wheel against the reference's own values.

The parity cases (tests/data/parity/reward_cases.jsonl.gz) were scored by
facebookresearch/swe-rl's `swerl.core.reward`; every entry point must return those values.
The metadata is checked against Python's own difflib, independently of the Rust code.

Set SWELAKE_SEED_SHARDS to a glob of seed shards to also score every instance's oracle answer.
"""

import difflib
import glob
import gzip
import itertools
import json
import os
import pathlib

import pytest

import swelake_reward as sr

ROOT = pathlib.Path(__file__).resolve().parents[4]
PARITY = ROOT / "tests" / "data" / "parity" / "reward_cases.jsonl.gz"


def load_cases():
    with gzip.open(PARITY, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


CASES = load_cases()
SEARCH_REPLACE = [c for c in CASES if c["kind"] == "search_replace"]
UNIDIFF = [c for c in CASES if c["kind"] == "unidiff"]


def same(got, case, similarities=None):
    """Bit for bit. The reference sums per-file similarities in the order of a Python set,
    which changes with the interpreter's hash seed; for a multi-file case the reference value
    is the sum in one of those orders, so it must equal the sum in some order."""
    want = case["expected"]
    if got == want:
        return True
    if similarities and len(similarities) <= 6:
        sims = [s["similarity"] for s in similarities]
        return any(sum(p) / len(p) == want for p in itertools.permutations(sims))
    return False


def unified(old, new):
    """The reference's generate_unified_diff, with Python's difflib."""
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), fromfile="old", tofile="new", lineterm="", n=3
        )
    )
    return "\n".join(lines[2:]) if len(lines) >= 2 else ""


def test_the_corpus_has_both_kinds():
    assert len(CASES) == 1000
    assert len(SEARCH_REPLACE) > 500 and len(UNIDIFF) > 200
    assert any(c["expected"] == -1.0 for c in SEARCH_REPLACE)


def test_calculate_search_replace_reward():
    wrong = []
    for c in SEARCH_REPLACE:
        reward, meta = sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])
        if not same(reward, c, meta.get("similarities")):
            wrong.append((c["id"], reward, c["expected"]))
        if reward == -1.0:
            assert set(meta) == {"error"} and meta["error"], c["id"]
        else:
            assert set(meta) == {"similarities", "thought", "answer"}, c["id"]
            assert meta["thought"] and c["output"].count(meta["thought"]) >= 1
    assert not wrong, wrong[:5]


def test_metadata_is_what_difflib_compares():
    checked = 0
    for c in SEARCH_REPLACE[:200]:
        reward, meta = sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])
        if reward == -1.0:
            continue
        paths = [s["path"] for s in meta["similarities"]]
        assert paths == sorted(paths)
        for s in meta["similarities"]:
            if s["path"] in c["oracle"]:
                oracle = unified(c["context"].get(s["path"], ""), c["oracle"][s["path"]])
                assert s["oracle_change"] == oracle, (c["id"], s["path"])
            if s["pred_change"] and s["oracle_change"]:
                ratio = difflib.SequenceMatcher(
                    None, s["pred_change"], s["oracle_change"], autojunk=False
                ).ratio()
                assert s["similarity"] == ratio, (c["id"], s["path"])
                checked += 1
    assert checked > 50


def test_calculate_reward_unidiff():
    wrong = []
    for c in UNIDIFF:
        reward, meta = sr.calculate_reward_unidiff(c["oracle_patches"], c["pred_patches"])
        if not same(reward, c, meta["similarities"]):
            wrong.append((c["id"], reward, c["expected"]))
        assert set(meta) == {"similarities"}
    assert not wrong, wrong[:5]


def ground_truth(c):
    return json.dumps({"kind": "search_replace", "context": c["context"], "oracle": c["oracle"]})


def test_compute_score_verl():
    wrong = []
    for c in SEARCH_REPLACE:
        got = sr.compute_score("swelake/swe-rl-seed", c["output"], ground_truth(c), extra_info={"index": 0})
        _, meta = sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])
        if not same(got, c, meta.get("similarities")):
            wrong.append((c["id"], got, c["expected"]))
    # A ground truth as a dict, with files as the shards' {path, content} lists.
    c = SEARCH_REPLACE[0]
    pairs = lambda m: [{"path": k, "content": v} for k, v in m.items()]
    truth = {"kind": "search_replace", "context": pairs(c["context"]), "oracle": pairs(c["oracle"])}
    assert sr.compute_score("x", c["output"], truth) == sr.compute_score("x", c["output"], ground_truth(c))
    assert not wrong, wrong[:5]


def test_compute_score_unidiff_ground_truth():
    for c in [c for c in UNIDIFF if len(c["pred_patches"]) == 1]:
        truth = json.dumps({"kind": "unidiff", "oracle_patches": c["oracle_patches"]})
        got = sr.compute_score("x", c["pred_patches"][0], truth)
        _, meta = sr.calculate_reward_unidiff(c["oracle_patches"], c["pred_patches"])
        assert same(got, c, meta["similarities"]), c["id"]


def check_all(values, cases):
    """Every value is the reference's (see `same`)."""
    wrong = []
    for v, c in zip(values, cases):
        meta = None
        if v != c["expected"]:
            if c["kind"] == "search_replace":
                meta = sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])[1]
            else:
                meta = sr.calculate_reward_unidiff(c["oracle_patches"], c["pred_patches"])[1]
        if not same(v, c, meta and meta.get("similarities")):
            wrong.append((c["id"], v, c["expected"]))
    assert len(values) == len(cases)
    assert not wrong, wrong[:5]


def test_trl_reward_function_on_every_case():
    completions = [[{"role": "assistant", "content": c["output"]}] for c in SEARCH_REPLACE]
    reward_model = [{"style": "rule", "ground_truth": ground_truth(c)} for c in SEARCH_REPLACE]
    check_all(sr.swerl_reward(completions=completions, reward_model=reward_model), SEARCH_REPLACE)


def test_batch_calls_on_every_case():
    check_all(sr.score_cases(CASES, num_threads=2), CASES)
    check_all(sr.score_cases(CASES, num_threads=1), CASES)
    outputs = [c["output"] for c in SEARCH_REPLACE]
    truths = [ground_truth(c) for c in SEARCH_REPLACE]
    check_all(sr.compute_score_batch(outputs, truths, num_threads=2), SEARCH_REPLACE)


def test_trl_reward_function():
    rows = SEARCH_REPLACE[:64]
    # Conversational completions, as GRPOTrainer passes them for the seed's chat prompts,
    # with the seed's reward_model column and the other columns TRL forwards.
    completions = [[{"role": "assistant", "content": c["output"]}] for c in rows]
    reward_model = [{"style": "rule", "ground_truth": ground_truth(c)} for c in rows]
    got = sr.swerl_reward(
        completions=completions,
        prompts=[[{"role": "user", "content": "p"}]] * len(rows),
        reward_model=reward_model,
        instance_id=[c["id"] for c in rows],
    )
    want = [sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])[0] for c in rows]
    assert got == want
    # Plain-text completions and the context/oracle columns instead of reward_model.
    pairs = lambda m: [{"path": k, "content": v} for k, v in m.items()]
    got = sr.swerl_reward(
        [c["output"] for c in rows],
        context=[pairs(c["context"]) for c in rows],
        oracle=[pairs(c["oracle"]) for c in rows],
    )
    assert got == want


def test_batch_calls_on_two_threads_match_one_by_one():
    one_by_one = [
        sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])[0]
        if c["kind"] == "search_replace"
        else sr.calculate_reward_unidiff(c["oracle_patches"], c["pred_patches"])[0]
        for c in CASES
    ]
    assert sr.score_cases(CASES, num_threads=2) == one_by_one
    assert sr.score_cases(CASES) == one_by_one
    outputs = [c["output"] for c in SEARCH_REPLACE]
    truths = [ground_truth(c) for c in SEARCH_REPLACE]
    sr_values = [v for v, c in zip(one_by_one, CASES) if c["kind"] == "search_replace"]
    assert sr.compute_score_batch(outputs, truths, num_threads=2) == sr_values


def test_bad_input_raises_instead_of_crashing():
    c = SEARCH_REPLACE[0]
    with pytest.raises(TypeError, match="solution_str must be a str"):
        sr.compute_score("x", 42, ground_truth(c))
    with pytest.raises(TypeError, match="solution_str must be a str"):
        sr.compute_score("x", None, ground_truth(c))
    with pytest.raises(ValueError, match="not a swelake ground truth"):
        sr.compute_score("x", c["output"], "{not json")
    with pytest.raises(ValueError, match="needs `context` and `oracle`"):
        sr.compute_score("x", c["output"], json.dumps({"kind": "search_replace", "context": {}}))
    with pytest.raises(ValueError, match="unknown kind"):
        sr.compute_score("x", c["output"], json.dumps({"kind": "nope"}))
    with pytest.raises(TypeError, match="ground_truth must be a JSON string or a dict"):
        sr.compute_score("x", c["output"], 3.5)
    with pytest.raises(TypeError):
        sr.calculate_search_replace_reward({"a.py": 1}, {}, "x")
    with pytest.raises(TypeError, match="output must be a str"):
        sr.calculate_search_replace_reward({}, {}, b"bytes")
    with pytest.raises(ValueError, match="2 solutions but 1 ground truths"):
        sr.compute_score_batch(["a", "b"], [ground_truth(c)])
    with pytest.raises(ValueError, match="ground_truths\\[1\\]"):
        sr.compute_score_batch(["a", "b"], [ground_truth(c), "[]"])
    with pytest.raises(ValueError, match="case 0 has no `output`"):
        sr.score_cases([{"kind": "search_replace", "context": {}, "oracle": {}}])
    with pytest.raises(ValueError, match="num_threads"):
        sr.score_cases(CASES[:1], num_threads=0)
    with pytest.raises(TypeError, match="a completion must be"):
        sr.swerl_reward([3], reward_model=[{"ground_truth": ground_truth(c)}])
    with pytest.raises(ValueError, match="needs the seed's `reward_model` column"):
        sr.swerl_reward(["x"], instance_id=["a"])


def test_no_change_on_either_side_is_one_as_in_the_reference():
    assert sr.calculate_reward({"a.py": "x\n"}, {"a.py": "x\n"}, {"a.py": "x\n"}) == (1.0, {"similarities": []})
    assert sr.calculate_reward_unidiff([], []) == (1.0, {"similarities": []})


def oracle_answer(context, oracle):
    """Each changed file as one edit: its whole old content searched, its new content put."""
    blocks = []
    for path, new in sorted(oracle.items()):
        old = context.get(path, "")
        if old != new:
            blocks.append(f"```\n### {path}\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n```")
    return "<think>\nApply the change.\n</think>\n<solution>\n" + "\n".join(blocks) + "\n</solution>"


@pytest.mark.skipif(not os.environ.get("SWELAKE_SEED_SHARDS"), reason="SWELAKE_SEED_SHARDS not set")
def test_seed_shards_oracle_answers_score_one():
    import pyarrow.parquet as pq

    shards = sorted(glob.glob(os.environ["SWELAKE_SEED_SHARDS"]))
    assert shards, os.environ["SWELAKE_SEED_SHARDS"]
    rows = [r for s in shards for r in pq.read_table(s).to_pylist()]
    assert rows
    for r in rows:
        truth = r["reward_model"]["ground_truth"]
        parsed = json.loads(truth)
        # The shards' columns agree with the ground truth they carry.
        assert {f["path"]: f["content"] for f in r["context"]} == parsed["context"]
        assert {f["path"]: f["content"] for f in r["oracle"]} == parsed["oracle"]
        answer = oracle_answer(parsed["context"], parsed["oracle"])
        assert sr.compute_score(r["data_source"], answer, truth, r["extra_info"]) == 1.0, r["instance_id"]
        assert sr.compute_score(r["data_source"], "no tags at all", truth) == -1.0
        assert sr.compute_score(r["data_source"], "<think>x</think><solution>nothing</solution>", truth) == -1.0
    got = sr.swerl_reward(
        [[{"role": "assistant", "content": oracle_answer(json.loads(r["reward_model"]["ground_truth"])["context"], json.loads(r["reward_model"]["ground_truth"])["oracle"])}] for r in rows],
        reward_model=[r["reward_model"] for r in rows],
    )
    assert got == [1.0] * len(rows)


def load_by_path(path, name):
    """How verl loads `custom_reward_function.path` (and OpenRLHF `--remote_rm_url`): the file
    executed as a module of its own, outside its package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_verl_loads_compute_score_by_file_path():
    c = SEARCH_REPLACE[0]
    module = load_by_path(sr.__file__, "custom_module")
    got = module.compute_score(data_source="swelake/swe-rl-seed", solution_str=c["output"],
                               ground_truth=ground_truth(c), extra_info=None)
    assert got == sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])[0]


def test_openrlhf_reward_func():
    rows = SEARCH_REPLACE[:8]
    module = load_by_path(pathlib.Path(__file__).parents[1] / "examples" / "openrlhf_reward.py", "rm")
    prompts = ["<|user|>fix it<|assistant|>"] * len(rows)
    got = module.reward_func(
        [p + c["output"] for p, c in zip(prompts, rows)],
        prompts,
        [{"style": "rule", "ground_truth": ground_truth(c)} for c in rows],
    )
    want = [sr.calculate_search_replace_reward(c["context"], c["oracle"], c["output"])[0] for c in rows]
    assert [float(x) for x in got] == want
