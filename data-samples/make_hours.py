#!/usr/bin/env python3
"""Writes the demo's GH Archive-shaped hour files (deterministic; rerun to regenerate).

Two hours of a fictional organisation `swelake-samples`:
- 2025-01-06-10.json.gz uses the full Events API payloads of 2015-2025;
- 2025-11-03-14.json uses the payloads as GitHub trimmed them on 2025-10-07 (PR stubs,
  pushes without commits), where PR titles and merge state must be recovered from issue
  events, and ends with two damaged lines that the ingest must reject, not drop.
"""
import gzip
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gharchive")
ORG = "swelake-samples"
_next_id = [48000000000]


def eid():
    _next_id[0] += 1
    return str(_next_id[0])


def user(login, uid, kind="User"):
    return {"login": login, "id": uid, "type": kind, "site_admin": False}


def actor(login, uid):
    return {"id": uid, "login": login, "display_login": login.replace("[bot]", ""), "gravatar_id": "",
            "url": f"https://api.github.com/users/{login}", "avatar_url": f"https://avatars.githubusercontent.com/u/{uid}?"}


def repo(name, rid):
    return {"id": rid, "name": f"{ORG}/{name}", "url": f"https://api.github.com/repos/{ORG}/{name}"}


def event(kind, who, uid, rname, rid, payload, ts):
    return {"id": eid(), "type": kind, "actor": actor(who, uid), "repo": repo(rname, rid), "payload": payload,
            "public": True, "created_at": ts, "org": {"id": 9000, "login": ORG}}


def pr_full(rname, rid, number, title, body, author, uid, kind, state, merged, merged_at, head_sha, base_sha, merge_sha,
            created, closed=None, labels=(), additions=3, deletions=1, files=1):
    full = f"{ORG}/{rname}"
    return {
        "url": f"https://api.github.com/repos/{full}/pulls/{number}", "id": rid * 1000 + number, "number": number,
        "state": state, "locked": False, "title": title, "user": user(author, uid, kind), "body": body,
        "created_at": created, "updated_at": closed or created, "closed_at": closed, "merged_at": merged_at,
        "merge_commit_sha": merge_sha, "labels": [{"name": l} for l in labels], "draft": False,
        "head": {"label": f"{author}:fix-{number}", "ref": f"fix-{number}", "sha": head_sha,
                 "repo": {"id": rid, "name": rname, "full_name": full}},
        "base": {"label": f"{ORG}:main", "ref": "main", "sha": base_sha, "repo": {"id": rid, "name": rname, "full_name": full}},
        "author_association": "CONTRIBUTOR", "merged": merged, "comments": 1, "review_comments": 0, "commits": 1,
        "additions": additions, "deletions": deletions, "changed_files": files,
    }


def issue_obj(rname, number, title, body, author, uid, state="open", pr_merged_at=None, is_pr=False, labels=()):
    full = f"{ORG}/{rname}"
    o = {"url": f"https://api.github.com/repos/{full}/issues/{number}", "number": number, "title": title,
         "user": user(author, uid), "labels": [{"name": l} for l in labels], "state": state, "comments": 0,
         "created_at": "2025-01-06T09:00:00Z", "updated_at": "2025-01-06T10:00:00Z", "closed_at": None, "body": body}
    if is_pr:
        o["pull_request"] = {"url": f"https://api.github.com/repos/{full}/pulls/{number}", "merged_at": pr_merged_at}
    return o


def hour_2025_01_06():
    calc, rid = "calc", 700001
    ev = []
    ev.append(event("IssuesEvent", "mira", 101, calc, rid, {"action": "opened", "issue": issue_obj(
        calc, 1, "divide() crashes with ZeroDivisionError",
        "Calling `calc.divide(1, 0)` raises ZeroDivisionError instead of returning None as documented.", "mira", 101,
        labels=["bug"])}, "2025-01-06T10:01:00Z"))
    ev.append(event("PullRequestEvent", "jonas", 102, calc, rid, {"action": "opened", "number": 2, "pull_request": pr_full(
        calc, rid, 2, "Return None when dividing by zero", "Fixes #1.\n\n<!-- checklist: tests added -->", "jonas", 102,
        "User", "open", False, None, "1" * 40, "0" * 40, None, "2025-01-06T10:05:00Z")}, "2025-01-06T10:05:00Z"))
    ev.append(event("PushEvent", "jonas", 102, calc, rid, {"repository_id": rid, "push_id": 1, "size": 1, "distinct_size": 1,
        "ref": "refs/heads/fix-2", "head": "1" * 40, "before": "0" * 40, "commits": [
            {"sha": "1" * 40, "author": {"email": "jonas@example.org", "name": "Jonas"},
             "message": "Guard divide() against zero divisors\n\nresolves #1", "distinct": True}]}, "2025-01-06T10:06:00Z"))
    ev.append(event("PullRequestReviewEvent", "mira", 101, calc, rid, {"action": "created", "review": {
        "id": 5001, "user": user("mira", 101), "body": "Looks good, thanks!", "state": "approved",
        "submitted_at": "2025-01-06T10:20:00Z"}, "pull_request": pr_full(
        calc, rid, 2, "Return None when dividing by zero", "Fixes #1.", "jonas", 102, "User", "open", False, None,
        "1" * 40, "0" * 40, None, "2025-01-06T10:05:00Z")}, "2025-01-06T10:20:00Z"))
    ev.append(event("PullRequestEvent", "mira", 101, calc, rid, {"action": "closed", "number": 2, "pull_request": pr_full(
        calc, rid, 2, "Return None when dividing by zero", "Fixes #1.\n\n<!-- checklist: tests added -->", "jonas", 102,
        "User", "closed", True, "2025-01-06T10:30:00Z", "1" * 40, "0" * 40, "2" * 40, "2025-01-06T10:05:00Z",
        "2025-01-06T10:30:00Z")}, "2025-01-06T10:30:00Z"))
    ev.append(event("PullRequestEvent", "dependabot[bot]", 49699333, calc, rid, {"action": "closed", "number": 3,
        "pull_request": pr_full(calc, rid, 3, "Bump pytest from 7.4.0 to 8.0.0", "Bumps pytest.", "dependabot[bot]",
        49699333, "Bot", "closed", True, "2025-01-06T10:40:00Z", "3" * 40, "2" * 40, "4" * 40, "2025-01-06T10:35:00Z",
        "2025-01-06T10:40:00Z", labels=["dependencies"])}, "2025-01-06T10:40:00Z"))
    ev.append(event("WatchEvent", "ravi", 103, calc, rid, {"action": "started"}, "2025-01-06T10:50:00Z"))
    return ev


def hour_2025_11_03():
    calc, rid = "calc", 700001
    ev = []
    stub = lambda n, head, base: {"id": rid * 1000 + n, "number": n, "url": f"https://api.github.com/repos/{ORG}/{calc}/pulls/{n}",
                                  "head": {"ref": f"fix-{n}", "sha": head, "repo": {"id": rid, "url": "u", "name": calc}},
                                  "base": {"ref": "main", "sha": base, "repo": {"id": rid, "url": "u", "name": calc}}}
    ev.append(event("PullRequestEvent", "ravi", 103, calc, rid, {"action": "opened", "number": 7, "pull_request": stub(7, "7" * 40, "4" * 40)}, "2025-11-03T14:02:00Z"))
    ev.append(event("IssueCommentEvent", "mira", 101, calc, rid, {"action": "created", "issue": issue_obj(
        calc, 7, "Handle empty input in mean()", "mean([]) divides by zero. Fixes #6", "ravi", 103, is_pr=True,
        pr_merged_at=None), "comment": {"id": 9001, "user": user("mira", 101), "body": "Can you add a test?",
        "created_at": "2025-11-03T14:10:00Z"}}, "2025-11-03T14:10:00Z"))
    ev.append(event("PushEvent", "ravi", 103, calc, rid, {"repository_id": rid, "push_id": 2, "ref": "refs/heads/fix-7",
        "head": "8" * 40, "before": "7" * 40}, "2025-11-03T14:20:00Z"))
    ev.append(event("PullRequestEvent", "mira", 101, calc, rid, {"action": "merged", "number": 7, "pull_request": stub(7, "8" * 40, "4" * 40)}, "2025-11-03T14:30:00Z"))
    ev.append(event("PullRequestEvent", "mira", 101, calc, rid, {"action": "closed", "number": 9, "pull_request": stub(9, "9" * 40, "4" * 40)}, "2025-11-03T14:40:00Z"))
    lines = [json.dumps(e, separators=(",", ":")) for e in ev]
    # Damage the demo must show as rejections: a cut-off line and a pre-2015 Timeline event.
    lines.insert(2, lines[2][: len(lines[2]) // 2])
    lines.append(json.dumps({"repository": {"name": "calc", "owner": "old"}, "actor": "someone", "type": "PushEvent",
                             "created_at": "2012-03-10T22:34:47-08:00", "payload": {}, "public": True}))
    return lines


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = [json.dumps(e, separators=(",", ":")) for e in hour_2025_01_06()]
    with gzip.GzipFile(os.path.join(OUT, "2025-01-06-10.json.gz"), "wb", mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())
    with open(os.path.join(OUT, "2025-11-03-14.json"), "w") as f:
        f.write("\n".join(hour_2025_11_03()) + "\n")


if __name__ == "__main__":
    main()
