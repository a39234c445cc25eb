"""The verdict of a run: every failure found in the result, and the exit
status (0 when everything ran and every one of ours was bit-exact; with
--linear, within the tolerance, and with --strict every target met)."""

from __future__ import annotations


def _check(where: str, flag: str, rec: dict, key: str, problem: str, failures: list,
           flagged: list) -> None:
    """One of our records: its error, or `problem` (and `flag` among the
    flagged) when rec[key] is not True."""
    if not rec["ours"]:
        return
    if rec["error"]:
        failures.append(f"{where}: {rec['error']}")
    elif rec[key] is not True:
        failures.append(f"{where}: {problem}")
        flagged.append(flag)


def _shape_failures(s: dict, failures: list, inexact: list) -> None:
    groups = [("", s.get("implementations", {}))]
    if s.get("sweep"):
        groups.append(("sweep ", s["sweep"]["candidates"]))
    for section, recs in groups:
        for name, rec in recs.items():
            where = f"{s['label']}: {section}{name}"
            _check(where, where, rec, "bitexact", "not bit-exact", failures, inexact)
    for p in s.get("prefill") or []:
        for name, err in p["errors"].items():
            failures.append(f"{s['label']}: prefill M={p['M']} {name}: {err}")


def _linear_failures(lin: dict, failures: list, outside: list) -> None:
    for layer in lin.get("layers", []):
        where = f"linear {layer.get('model')} {layer['label']} {layer['dtype']}"
        if layer.get("error"):
            failures.append(f"{where}: {layer['error']}")
        for p in layer.get("points", []):
            for name, rec in p["impls"].items():
                _check(f"{where} M={p['M']}: {name}",
                       f"{layer['label']} {layer['dtype']} M={p['M']}: {name}", rec,
                       "within_tolerance", "outside the tolerance", failures, outside)


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
    outside: list[str] = []
    if result.get("linear"):
        _linear_failures(result["linear"], failures, outside)
    verdict = result.get("verdict") or {}
    if verdict.get("strict"):
        failures += [f"target missed: {t}" for t in verdict.get("missed_text", [])]
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
        "linear_outside_tolerance": outside,
        "linear_flagged": [f"{lay['label']} {lay['dtype']} M={p['M']}"
                           for lay in (result.get("linear") or {}).get("layers", [])
                           for p in lay.get("points", []) if p.get("flagged")],
        "targets_missed": len(verdict.get("missed_text", [])),
    }
    return code
