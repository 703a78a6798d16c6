"""Two servers' retrieval_eval reports, question for question: how far apart they are.

    python -m sglang_dsv41.tools.retrieval_compare --base CPU.json [CPU2.json ...]
        --new GPU.json [GPU2.json ...] [--points 2] [--json OUT.json]

Each side is one or more `retrieval_eval --json` reports. A question is the same on both sides
when its task (form, filler, facts, question seed) and its cell (length, depth, index) are: the
same flags ask the same questions of every server. Over the questions both sides asked, per
length: each side's accuracy, the difference in points (new - base), the worst per-depth
difference, and how many replies differ. The verdict holds when, at every length, the
difference is within --points (default 2) of the base.

Exit status: 0 within, 1 not within, 2 when the sides share no question (a usage error).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sglang_dsv41.tools.cli import cli_parser

TASK_FIELDS = ("form", "filler", "facts", "seed")


def question_key(report: dict, record: dict) -> tuple:
    """-> (form, filler, facts, seed, length, depth, index) of one record."""
    task = tuple(report[f] for f in TASK_FIELDS)
    return (*task, record["length"], float(record["depth"]), record["index"])


def records_by_question(reports: list) -> dict:
    """[retrieval_eval report] -> question key -> record (a later report's answer wins)."""
    out = {}
    for rep in reports:
        for r in rep["records"]:
            out[question_key(rep, r)] = r
    return out


def percent(oks: list) -> float:
    return 100.0 * sum(oks) / len(oks)


def compare(base: list, new: list, points: float = 2.0) -> dict:
    """base, new: lists of retrieval_eval reports -> {"lengths": {LEN: row}, "within": bool,
    "shared": questions compared, "base_only", "new_only"}. Raises ValueError when the sides
    share no question."""
    a, b = records_by_question(base), records_by_question(new)
    shared = sorted(set(a) & set(b), key=lambda k: (k[4], k[5], k[6], k[:4]))
    if not shared:
        raise ValueError(
            "the two sides asked no question in common (compare reports made with the same "
            "--form, --filler, --facts, --seed and overlapping --lengths / --per-cell)"
        )
    rows = {}
    for n in sorted({k[4] for k in shared}):
        keys = [k for k in shared if k[4] == n]
        depth_diff = {}
        for d in sorted({k[5] for k in keys}):
            cell = [k for k in keys if k[5] == d]
            depth_diff[f"{d:g}"] = percent([b[k]["ok"] for k in cell]) - percent(
                [a[k]["ok"] for k in cell]
            )
        base_pct = percent([a[k]["ok"] for k in keys])
        new_pct = percent([b[k]["ok"] for k in keys])
        worst = max(depth_diff, key=lambda d: abs(depth_diff[d]))
        rows[str(n)] = {
            "questions": len(keys),
            "base": round(base_pct, 2),
            "new": round(new_pct, 2),
            "diff": round(new_pct - base_pct, 2),
            "depth_diff": {d: round(v, 2) for d, v in depth_diff.items()},
            "worst_depth": worst,
            "replies_differ": sum(a[k]["reply"] != b[k]["reply"] for k in keys),
            "answers_differ": sum(a[k]["answer"] != b[k]["answer"] for k in keys),
        }
    return {
        "points": points,
        "lengths": rows,
        "within": all(abs(r["diff"]) <= points for r in rows.values()),
        "shared": len(shared),
        "base_only": len(set(a) - set(b)),
        "new_only": len(set(b) - set(a)),
    }


def format_comparison(cmp: dict) -> str:
    head = (
        "length | questions | base % | new % | diff | worst depth diff | replies / answers differ"
    )
    lines = [head, "-" * len(head)]
    for n, r in cmp["lengths"].items():
        worst = f"{r['depth_diff'][r['worst_depth']]:+.1f} (d={r['worst_depth']})"
        lines.append(
            f"{n:>6} | {r['questions']:>9} | {r['base']:6.1f} | {r['new']:5.1f} | "
            f"{r['diff']:+5.1f} | {worst:>16} | {r['replies_differ']} / {r['answers_differ']}"
        )
    verdict = "yes" if cmp["within"] else "NO"
    lines.append(
        f"within {cmp['points']:g} points at every length: {verdict} ({cmp['shared']} questions "
        f"in common; {cmp['base_only']} base only, {cmp['new_only']} new only)"
    )
    return "\n".join(lines)


def load_reports(paths: list) -> list:
    out = []
    for p in paths:
        rep = json.loads(Path(p).read_text(encoding="utf-8"))
        missing = [f for f in (*TASK_FIELDS, "records") if f not in rep]
        if missing:
            raise ValueError(f"{p}: not a retrieval_eval report (no {', '.join(missing)})")
        out.append(rep)
    return out


def main(argv=None) -> int:
    p = cli_parser("sglang_dsv41.tools.retrieval_compare", __doc__)
    p.add_argument("--base", nargs="+", required=True, help="the reference side's reports")
    p.add_argument("--new", nargs="+", required=True, help="the compared side's reports")
    p.add_argument("--points", type=float, default=2.0, help="allowed difference (default 2)")
    p.add_argument("--json", help="write the comparison here")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.points < 0:
        p.error("--points must be >= 0")
    try:
        cmp = compare(load_reports(args.base), load_reports(args.new), args.points)
    except (OSError, ValueError) as e:
        print(f"retrieval_compare: {e}", file=sys.stderr)
        return 2
    print(format_comparison(cmp))
    if args.json:
        Path(args.json).write_text(json.dumps(cmp, indent=2) + "\n", encoding="utf-8")
    return 0 if cmp["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
