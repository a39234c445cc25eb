"""The verdict of a run: every failure found in the result, and the exit
status (0 when everything ran and every one of ours was bit-exact)."""

from __future__ import annotations


def _shape_failures(s: dict, failures: list, inexact: list) -> None:
    groups = [("", s.get("implementations", {}))]
    if s.get("sweep"):
        groups.append(("sweep ", s["sweep"]["candidates"]))
    for section, recs in groups:
        for name, rec in recs.items():
            if not rec["ours"]:
                continue
            if rec["error"]:
                failures.append(f"{s['label']}: {section}{name}: {rec['error']}")
            elif rec["bitexact"] is not True:
                failures.append(f"{s['label']}: {section}{name}: not bit-exact")
                inexact.append(f"{s['label']}: {section}{name}")
    for p in s.get("prefill") or []:
        for name, err in p["errors"].items():
            failures.append(f"{s['label']}: prefill M={p['M']} {name}: {err}")


def finish(result: dict) -> int:
    """Fill result["summary"] and return the exit status.

    A peer that differs from the reference is listed, never failed: its
    results are reported for comparison, the contract holds ours.
    """
    failures: list[str] = []
    inexact: list[str] = []
    for s in result["shapes"]:
        _shape_failures(s, failures, inexact)
    floor = result.get("launch_floor")
    if floor and floor["error"]:
        failures.append(f"launch floor: {floor['error']}")
    elif floor and floor["bitexact"] is not True:
        failures.append("launch floor: not bit-exact")
        inexact.append("launch floor")
    host = result.get("host_overhead")
    if host:
        for name, e in host["cases"].items():
            if e.get("error"):
                failures.append(f"host overhead {name}: {e['error']}")
    peers_inexact = sorted({n for s in result["shapes"]
                            for n, r in s.get("implementations", {}).items()
                            if not r["ours"] and r["bitexact"] is False})
    code = 1 if failures else 0
    result["summary"] = {
        "exit_code": code,
        "all_ours_bitexact": not inexact,
        "ours_not_bitexact": inexact,
        "failures": failures,
        "peers_not_bitexact": peers_inexact,
        "flagged_shapes": [s["label"] for s in result["shapes"] if s.get("flagged")],
    }
    return code
