"""Makes the review fixtures of tests/it/github_api.rs from GH Archive's real 2025-01-01-15 hour
(the excerpt in ../shared/gharchive): for the two repositories of that hour with both review
and review-comment events, their archive lines, and the REST objects those events carry as the
API serves them — the pulls list's "simple" PR objects, `pulls/comments` items, and each PR's
reviews (with REST's upper-case `state`; the Events API writes it lower-case).

usage: python3 reviews_from_excerpt.py ../../../../shared/gharchive/2025-01-01-15.json.gz
"""
import gzip
import json
import os
import sys

REPOS = ["highlightjs/highlight.js", "minkphp/webdriver-classic-driver"]
# Fields of a PR object that GitHub's pulls list leaves out.
NOT_SIMPLE = ["merged", "mergeable", "mergeable_state", "merged_by", "comments", "review_comments",
              "maintainer_can_modify", "commits", "additions", "deletions", "changed_files", "rebaseable"]

here = os.path.dirname(os.path.abspath(__file__))
lines = [l for l in gzip.open(sys.argv[1], "rt", encoding="utf-8")]
api = {r: {"repo": None, "pulls": {}, "issues": [], "comments": [], "review_comments": [], "reviews": {}} for r in REPOS}
kept = []
for line in lines:
    e = json.loads(line)
    r = e["repo"]["name"]
    if r not in api:
        continue
    kept.append(line if line.endswith("\n") else line + "\n")
    p = e["payload"]
    pr = p.get("pull_request")
    if pr:
        simple = {k: v for k, v in pr.items() if k not in NOT_SIMPLE}
        old = api[r]["pulls"].get(pr["number"])
        if old is None or old["updated_at"] <= simple["updated_at"]:
            api[r]["pulls"][pr["number"]] = simple
        api[r]["repo"] = pr["base"]["repo"]
    if e["type"] == "PullRequestReviewCommentEvent":
        api[r]["review_comments"].append(p["comment"])
    if e["type"] == "PullRequestReviewEvent":
        review = dict(p["review"])
        review["state"] = review["state"].upper()
        api[r]["reviews"].setdefault(str(pr["number"]), []).append(review)
for r in api.values():
    r["pulls"] = sorted(r["pulls"].values(), key=lambda x: x["number"])
with open(os.path.join(here, "api-reviews-2025-01-01-15.json"), "w", encoding="utf-8") as f:
    json.dump(api, f, indent=1, sort_keys=True, ensure_ascii=False)
    f.write("\n")
with open(os.path.join(here, "reviews-2025-01-01-15.json"), "w", encoding="utf-8") as f:
    f.writelines(kept)
