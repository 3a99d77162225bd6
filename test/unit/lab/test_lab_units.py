"""overlay_manager.lab.campus.units: unit files read as systemd reads them, and the stop-propagation graph."""
import pytest

from overlay_manager.lab.campus import units as u


def _write(d, files):
    for rel, text in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return d


def test_continuations_comments_and_resets(tmp_path):
    d = _write(tmp_path, {"a.service": "# c\n[Unit]\nRequires=b.service \\\n  c.service\n; c2\n"
                                       "[Service]\nExecStart=/bin/bash -c 'echo $$X \\\n  done'\n"
                                       'Environment=A=1 "B=two words"\n',
                          "a.service.d/10-reset.conf": "[Unit]\nRequires=\nRequires=d.service\n"})
    unit = u.load_units([d])["a.service"]
    assert unit.names("Unit", "Requires") == ["d.service"], "an empty assignment resets the list"
    assert u.exec_start(unit) == "echo $X    done"
    assert u.unit_environment(unit) == {"A": "1", "B": "two words"}
    with pytest.raises(ValueError):
        u.parse_unit_text("[Unit]\nnot an assignment\n")


def test_every_propagating_key_counts_and_wants_does_not(tmp_path):
    d = _write(tmp_path, {
        "y.service": "[Unit]\nPropagatesStopTo=p.service\n[Install]\nRequiredBy=r.service\n",
        "req.service": "[Unit]\nRequires=y.service\n", "rq.service": "[Unit]\nRequisite=y.service\n",
        "b.service": "[Unit]\nBindsTo=y.service\n", "part.service": "[Unit]\nPartOf=y.service\n",
        "s.service": "[Unit]\nStopPropagatedFrom=y.service\n", "p.service": "[Unit]\n",
        "r.service": "[Unit]\n", "w.service": "[Unit]\nWants=y.service\nAfter=y.service\n",
        "chain.service": "[Unit]\nRequires=req.service\n"})
    units = u.load_units([d])
    assert u.stopped_with(units, "y.service") == {"req.service", "rq.service", "b.service", "part.service",
                                                  "s.service", "p.service", "r.service", "chain.service"}
    assert u.propagation_path(units, "y.service", "chain.service") == [
        "req.service: Requires=y.service", "chain.service: Requires=req.service"]
    assert u.propagation_path(units, "y.service", "w.service") == []


def test_first_directory_wins_and_drop_ins_come_from_all(tmp_path):
    a = _write(tmp_path / "a", {"x.service": "[Unit]\nDescription=first\n"})
    b = _write(tmp_path / "b", {"x.service": "[Unit]\nDescription=second\n",
                                "x.service.d/z.conf": "[Unit]\nRequires=y.service\n"})
    unit = u.load_units([a, b])["x.service"]
    assert unit.value("Unit", "Description") == "first"
    assert unit.names("Unit", "Requires") == ["y.service"]


def test_environment_file_lines():
    assert u.environment_lines(["# c", "", "A=1", 'B="x \\"y\\""', "C="]) == {"A": "1", "B": 'x "y"', "C": ""}
