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

__all__ = [
    "calculate_reward",
    "calculate_reward_unidiff",
    "calculate_search_replace_reward",
    "compute_score",
    "compute_score_batch",
    "score_cases",
    "swerl_reward",
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
