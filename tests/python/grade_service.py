"""Calls a running `swelake grade-server` through the swelake_reward package the way the
trainers call a reward function: verl's per-item `compute_score(data_source=, solution_str=,
ground_truth=, extra_info=)`, verl's batch manager with the plural keywords, and TRL's
`reward_func(prompts=, completions=, completion_ids=, **dataset_columns)`. The service's address
and token come from SWELAKE_GRADER_URL and SWELAKE_GRADER_TOKEN, as a trainer's job would set
them. Prints one JSON line of what each returned."""

import json
import sys
import urllib.error
import urllib.request

import swelake_reward as sr

payload = json.load(open(sys.argv[1]))["items"]
out = {}
out["verl"] = [
    sr.compute_score_tests(
        data_source="swelake/swe-rl",
        solution_str=item["completion"],
        ground_truth="{}",
        extra_info=item["extra_info"],
        mode="tests",
    )
    for item in payload
]
out["verl_batch"] = sr.compute_score_tests_batch(
    data_sources=["swelake/swe-rl"] * len(payload),
    solution_strs=[i["completion"] for i in payload],
    ground_truths=["{}"] * len(payload),
    extra_infos=[i["extra_info"] for i in payload],
    mode="tests",
)
trl = sr.make_tests_reward("tests")
out["trl"] = trl(
    prompts=[[{"role": "user", "content": "fix it"}]] * len(payload),
    completions=[[{"role": "assistant", "content": i["completion"]}] for i in payload],
    completion_ids=[[1, 2, 3]] * len(payload),
    instance_id=[i["instance_id"] for i in payload],
    extra_info=[i["extra_info"] for i in payload],
    trainer_state=None,
)
# Without the token the service answers nothing.
req = urllib.request.Request(
    sr._os.environ["SWELAKE_GRADER_URL"] + "/grade",
    data=b'{"items": []}',
    method="POST",
    headers={"Content-Type": "application/json", "Authorization": "Bearer wrong"},
)
try:
    urllib.request.urlopen(req)
    out["unauthorized"] = 200
except urllib.error.HTTPError as e:
    out["unauthorized"] = e.code
print(json.dumps(out))
