"""OpenRLHF reward function on swelake's seed: pass this file as `--remote_rm_url` with
`--label_key reward_model` (each label is the row's reward_model {style, ground_truth}).

OpenRLHF calls reward_func(queries, prompts, labels): a query is the prompt followed by the
response, so the answer is what follows the prompt.
"""
from swelake_reward import compute_score_batch


def reward_func(queries, prompts, labels, **kwargs):
    answers = [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts)]
    truths = [l["ground_truth"] if isinstance(l, dict) else l for l in labels]
    rewards = compute_score_batch(answers, truths)
    try:
        import torch

        return torch.tensor(rewards)
    except ImportError:
        return rewards
