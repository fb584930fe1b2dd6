#!/usr/bin/env python3
"""Python baseline for the reward benchmark (and a cross-check of the Rust port).

Computes the SWE-RL reward of every case in a reward-cases JSONL file the way the public
reference (facebookresearch/swe-rl, src/swerl/core/reward.py) does: python3's own difflib
(SequenceMatcher(None, a, b, autojunk=False).ratio() and unified_diff(n=3, lineterm=""))
and, for unified-diff cases, the file-level split of the `unidiff` package.

Usage: reward_baseline.py CASES.jsonl[.gz] [--out OUT.jsonl] [--check]
Prints cases/s on stderr; with --check compares against each line's "expected".
"""
import difflib
import gzip
import json
import re
import sys
import time

SR_RE = re.compile(
    r"```.*?\n### (.*)\n<<<<<<< SEARCH\n([\s\S]*?)\n=======\n([\s\S]*?)\n>>>>>>> REPLACE\n```"
)
TAGS = ("<think>", "</think>", "<solution>", "</solution>")


class FormatError(Exception):
    pass


def unified(old, new):
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), fromfile="old", tofile="new", lineterm="", n=3
        )
    )
    return "\n".join(lines[2:]) if len(lines) >= 2 else ""


def patches(context, new_contents):
    out = {}
    for path, new in new_contents.items():
        p = unified(context.get(path, ""), new)
        if p:
            out[path] = p
    return out


def mean_similarity(pred, oracle):
    sims = []
    for path in set(oracle) | set(pred):
        a, b = pred.get(path, ""), oracle.get(path, "")
        sims.append(0.0 if a == "" or b == "" else
                    difflib.SequenceMatcher(None, a, b, autojunk=False).ratio())
    return sims


def search_replace_reward(context, oracle, output):
    try:
        for tag in TAGS:
            if output.count(tag) != 1:
                raise FormatError(f"count of {tag} is not 1")
        thought = output.split("<think>")[1].split("</think>")[0].strip()
        answer = output.split("<solution>")[1].split("</solution>")[0].strip()
        if not thought:
            raise FormatError("Thought is empty")
        edits = {}
        for path, search, replace in SR_RE.findall(answer):
            edits.setdefault(path, []).append((search, replace))
        if not edits:
            raise FormatError("No valid search blocks found")
        pred = {}
        for path, pairs in edits.items():
            content = "\n" + context.get(path, "")
            for search, replace in pairs:
                if search == replace:
                    raise FormatError("Search and replace blocks are identical")
                if "\n" + search not in content:
                    raise FormatError("Search block not found")
                content = content.replace("\n" + search, "\n" + replace)
            pred[path] = content[1:]
        sims = mean_similarity(patches(context, pred), patches(context, oracle))
        return sum(sims) / len(sims)
    except FormatError:
        return -1.0


def filelevel(patch_text):
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        ps = PatchSet(patch_text)
    except UnidiffParseError:
        return {}
    except Exception:  # the reference also swallows unexpected parser errors
        return {}
    out = {}
    for pf in ps:
        if pf.is_binary_file:
            continue
        if pf.is_rename:
            src, tgt = pf.source_file, pf.target_file
            src = src[2:] if src.startswith("a/") else src
            tgt = tgt[2:] if tgt.startswith("b/") else tgt
            header, path = f"rename from {src} to {tgt}", src
        else:
            header, path = "", pf.path
        body = "\n".join(str(h).strip() for h in pf)
        out[path] = (header + "\n" + body).strip()
    return out


def unidiff_reward(oracle_patches, pred_patches):
    oracle, pred = {}, {}
    for p in oracle_patches:
        oracle.update(filelevel(p))
    for p in pred_patches:
        pred.update(filelevel(p))
    sims = mean_similarity(pred, oracle)
    return 1.0 if not sims else sum(sims) / len(sims)


def score(case):
    if case["kind"] == "search_replace":
        return search_replace_reward(case["context"], case["oracle"], case["output"])
    return unidiff_reward(case["oracle_patches"], case["pred_patches"])


def main():
    args = sys.argv[1:]
    path = args[0]
    out = args[args.index("--out") + 1] if "--out" in args else None
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    t0 = time.perf_counter()
    rewards = [score(c) for c in cases]
    dt = time.perf_counter() - t0
    print(f"python-difflib: {len(cases)} cases in {dt:.3f}s = {len(cases) / dt:.1f} cases/s",
          file=sys.stderr)
    if out:
        with open(out, "w") as f:
            for c, r in zip(cases, rewards):
                f.write(json.dumps({"id": c["id"], "reward": r}) + "\n")
    if "--check" in args:
        bad = [(c["id"], r, c["expected"]) for c, r in zip(cases, rewards)
               if abs(r - c["expected"]) > 1e-9]
        print(f"mismatches vs expected: {len(bad)}", file=sys.stderr)
        for b in bad[:10]:
            print("  ", b, file=sys.stderr)
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
