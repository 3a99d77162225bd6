"""The NAT-matrix reports: notes on the cells that missed the model, and the files a run writes
(``lab nat-matrix --from-json`` re-renders them without a lab)."""
import json

from overlay_manager.lab.matrix import model as matrix_model
from overlay_manager.lab.matrix import run as matrix


def _cell(a, b, observed):
    return {"a": a, "b": b, "observed": observed, "via": "x", "ping_output": "..."}


def test_note_surprises_explains_only_the_cells_that_missed(monkeypatch):
    monkeypatch.setitem(matrix_model.NOTES, ("eim-adpf", "adpm-adpf"), "a known reason")
    cells = [dict(_cell("eim-adpf", "adpm-adpf", "direct"), expected="derp"),
             dict(_cell("adpm-adpf", "adpm-adpf", "direct"), expected="derp"),
             dict(_cell("eim-eif", "eim-eif", "direct"), expected="direct")]
    matrix.note_surprises(cells)
    assert cells[0]["note"] == "a known reason"
    assert cells[1]["note"] == matrix.UNEXPLAINED
    assert "note" not in cells[2]


def test_rerender_writes_json_and_markdown_from_an_earlier_run(tmp_path):
    meta = {"date": "2026-11-22 10:00", "tailscale": "v1", "headscale": "v2", "count": 10, "parallel": 6,
            "setup_seconds": 7.0, "seconds": 60.0, "cells": 2, "agree": 0, "rule_agree": 0, "run_id": "r1"}
    earlier = {"meta": meta, "kinds": ["eim-adpf", "adpm-adpf"],
               "cells": [_cell("eim-adpf", "eim-adpf", "direct"), _cell("eim-adpf", "adpm-adpf", "direct")]}
    src = tmp_path / "earlier.json"
    src.write_text(json.dumps(earlier))
    data = matrix.rerender(src, tmp_path / "out")
    assert [c["expected"] for c in data["cells"]] == ["direct", "derp"]     # from the model, not the file
    assert "note" not in data["cells"][0] and data["cells"][1]["note"] == matrix.UNEXPLAINED
    assert data["meta"]["agree"] == 1 and data["meta"]["cells"] == 2
    written = (tmp_path / "out" / "nat_matrix.json").read_text()
    assert written.endswith("\n") and json.loads(written) == data
    assert (tmp_path / "out" / "nat_matrix.md").read_text() == matrix.render_markdown(data["cells"], data["meta"])
