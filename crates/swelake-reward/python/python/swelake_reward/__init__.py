"""The SWE-RL reward, computed in Rust with the values of facebookresearch/swe-rl.

Entry points:

* ``calculate_search_replace_reward(code_context, oracle_new_content, output)``,
  ``calculate_reward(code_context, oracle_new_content, pred_new_content)`` and
  ``calculate_reward_unidiff(oracle_patches, pred_patches)``: the reference's functions
  (``swerl.core.reward``), each returning ``(reward, metadata)``; change the import and a
  script written against the reference runs unchanged.
* ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``: verl's custom
  reward function, reading ``reward_model.ground_truth`` of swelake's seed shards.
* ``swerl_reward(completions, **columns)``: a reward function for TRL's
  ``GRPOTrainer(reward_funcs=swerl_reward)`` on swelake's seed shards.
* ``compute_score_batch(solution_strs, ground_truths, num_threads=None)`` and
  ``score_cases(cases, num_threads=None)``: many cases on N threads, the GIL released.
* Rewards that run the tests, through a running ``swelake grade-server`` (its address and token
  in ``SWELAKE_GRADER_URL`` and ``SWELAKE_GRADER_TOKEN``, or as arguments):
  ``compute_score_tests`` (verl's per-item reward function), ``compute_score_tests_batch``
  (verl's batch reward manager), ``make_tests_reward(mode)`` / ``tests_reward`` (TRL's
  ``reward_funcs``) and ``grade(items, mode)`` (the service's answer as it is). Modes:
  ``similarity``, ``tests`` (-1 malformed, 0 unresolved, 1 resolved) and ``hybrid``.

Bad input raises ``TypeError`` (a value of the wrong type) or ``ValueError`` (a ground truth
or case that does not parse).
"""

# Absolute, so that verl's loader, which executes this file by path as a module of its own
# (`custom_reward_function.path=.../swelake_reward/__init__.py`), finds the native module.
from swelake_reward._swelake_reward import (
    calculate_reward,
    calculate_reward_unidiff,
    calculate_search_replace_reward,
    compute_score,
    compute_score_batch,
    score_cases,
)

import json as _json
import os as _os
import urllib.error as _urlerror
import urllib.request as _request

__all__ = [
    "calculate_reward",
    "calculate_reward_unidiff",
    "calculate_search_replace_reward",
    "compute_score",
    "compute_score_batch",
    "compute_score_tests",
    "compute_score_tests_batch",
    "grade",
    "make_tests_reward",
    "score_cases",
    "swerl_reward",
    "tests_reward",
]


def _completion_text(completion):
    """TRL passes plain strings for standard datasets and message lists for conversational
    ones (the seed's ``prompt`` is a chat list): the answer is the last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return completion[-1].get("content")
    raise TypeError(
        "a completion must be a str or a list of {role, content} messages, not "
        f"{type(completion).__name__}"
    )


def _ground_truths(n, columns):
    """Each row's ground truth from the seed columns TRL forwards: ``reward_model`` (its
    ``ground_truth``), else ``context`` and ``oracle`` (lists of {path, content})."""
    reward_model = columns.get("reward_model")
    if reward_model is not None:
        return [row["ground_truth"] if isinstance(row, dict) else row for row in reward_model]
    context, oracle = columns.get("context"), columns.get("oracle")
    if context is None or oracle is None:
        raise ValueError(
            "swerl_reward needs the seed's `reward_model` column, or `context` and `oracle`: "
            f"got the columns {sorted(columns)}"
        )
    return [{"kind": "search_replace", "context": c, "oracle": o} for c, o in zip(context, oracle)]


def swerl_reward(completions, num_threads=None, **columns):
    """TRL reward function: ``GRPOTrainer(reward_funcs=swerl_reward, train_dataset=seed)``.

    TRL calls it with the completions and every other dataset column as a keyword argument
    (one value per completion); returns one reward per completion, -1.0 for a malformed one.
    """
    texts = [_completion_text(c) for c in completions]
    truths = _ground_truths(len(texts), columns)
    if len(truths) != len(texts):
        raise ValueError(f"{len(texts)} completions but {len(truths)} ground truths")
    return compute_score_batch(texts, truths, num_threads=num_threads)


def grade(items, mode="hybrid", url=None, token=None, timeout=None):
    """Grades ``items`` (dicts with ``instance_id`` and ``completion`` or ``patch``) on a running
    ``swelake grade-server``: each patch runs against its instance's FAIL_TO_PASS and
    PASS_TO_PASS tests in the server's sandbox. Returns one result dict per item, in order
    (``reward``, ``reward_similarity``, ``reward_tests``, ``reward_hybrid``, ``resolved``,
    ``f2p_passed``/``f2p_total``, ``p2p_passed``/``p2p_total``, ``status``, ``reason``, ...)."""
    url = (url or _os.environ.get("SWELAKE_GRADER_URL") or "http://127.0.0.1:8091").rstrip("/")
    token = token or _os.environ.get("SWELAKE_GRADER_TOKEN")
    if not token:
        raise ValueError("the grading service needs its token: SWELAKE_GRADER_TOKEN or token=")
    items = list(items)
    if not items:
        return []
    body = _json.dumps({"mode": mode, "items": items}).encode("utf-8")
    req = _request.Request(
        url + "/grade",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + token},
    )
    try:
        with _request.urlopen(req, timeout=timeout) as r:
            results = _json.loads(r.read())["results"]
    except _urlerror.HTTPError as e:
        raise RuntimeError(f"{url}/grade answered {e.code}: {e.read().decode('utf-8', 'replace')}") from None
    if len(results) != len(items):
        raise RuntimeError(f"{url}/grade answered {len(results)} results for {len(items)} items")
    return results


def _instance_id(extra_info, instance_id=None):
    """The seed's ``owner/name#N``: given, or from verl's ``extra_info`` of swelake's shards."""
    if instance_id:
        return instance_id
    if isinstance(extra_info, dict):
        if extra_info.get("instance_id"):
            return extra_info["instance_id"]
        if extra_info.get("repo_name") and extra_info.get("pr_number") is not None:
            return f"{extra_info['repo_name']}#{extra_info['pr_number']}"
    raise ValueError(
        "which instance? give extra_info with repo_name and pr_number (swelake's seed shards "
        "carry them) or instance_id"
    )


def _verl_result(r):
    """verl reads ``score`` and logs the other keys; an answer the service could not grade
    (an instance it did not verify) scores 0.0 and says why in ``error``."""
    out = {k: v for k, v in r.items() if k != "reward"}
    out["score"] = 0.0 if r.get("reward") is None else float(r["reward"])
    return out


def compute_score_tests(data_source=None, solution_str=None, ground_truth=None, extra_info=None, *,
                        mode=None, url=None, token=None, instance_id=None, **_ignored):
    """verl's custom reward function (``custom_reward_function.name=compute_score_tests``):
    the completion graded by running its instance's tests. ``mode`` defaults to
    ``SWELAKE_REWARD_MODE`` or ``hybrid``."""
    mode = mode or _os.environ.get("SWELAKE_REWARD_MODE", "hybrid")
    item = {"instance_id": _instance_id(extra_info, instance_id), "completion": solution_str}
    return _verl_result(grade([item], mode, url, token)[0])


def compute_score_tests_batch(data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None, *,
                              mode=None, url=None, token=None, **_ignored):
    """verl's batch reward manager form: every completion of the batch in one request, graded
    N at once by the service."""
    mode = mode or _os.environ.get("SWELAKE_REWARD_MODE", "hybrid")
    extra_infos = extra_infos if extra_infos is not None else [None] * len(solution_strs)
    items = [{"instance_id": _instance_id(e), "completion": s} for s, e in zip(solution_strs, extra_infos)]
    return [_verl_result(r) for r in grade(items, mode, url, token)]


def make_tests_reward(mode="hybrid", url=None, token=None):
    """A TRL reward function (``GRPOTrainer(reward_funcs=make_tests_reward("hybrid"))``): TRL
    calls it with the completions and the dataset's columns (``instance_id`` or
    ``extra_info``); one reward per completion, ``None`` where the service could not grade
    (TRL then leaves the completion out of that function's reward)."""

    def reward(prompts=None, completions=None, instance_id=None, extra_info=None, **_columns):
        texts = [_completion_text(c) for c in completions]
        n = len(texts)
        ids = instance_id if instance_id is not None else [None] * n
        infos = extra_info if extra_info is not None else [None] * n
        items = [{"instance_id": _instance_id(e, i), "completion": t} for t, i, e in zip(texts, ids, infos)]
        return [r.get("reward") for r in grade(items, mode, url, token)]

    reward.__name__ = f"swelake_{mode}_reward"
    return reward


tests_reward = make_tests_reward(_os.environ.get("SWELAKE_REWARD_MODE", "hybrid"))
