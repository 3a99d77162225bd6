"""Names of the repository's files hold: every file or folder that docs/ARCHITECTURE.md names
exists, every module path a doc names exists, every repository path a Python docstring or comment
or a C++ comment names exists, and the plugin XMLs name libraries and classes the build makes."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# where a bare or partial name is looked up, in order (the doc names modules the short way)
BASES = ["", "overlay_manager", "docs", "src", "include/overlay_manager", "test", "test/unit", "test/system",
         "test/rostest", "test/integration", "test/cpp", "test/gui", "config", "config/systemd", "launch", "scripts",
         "overlay_msgs/msg", "overlay_msgs/srv"]
FILE = re.compile(r"^[\w./-]+\.(py|cpp|h|md|launch|yaml|test|xml|msg|srv|service|in|conf|ui|txt|rst)$")


def _spans(text: str) -> List[str]:
    """Every `code span` (or markdown link target) of text that looks like a file or folder path."""
    spans = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)#\s]+)", text)
    out = []
    for s in spans:
        s = s.strip().rstrip(",.;:")
        if s.startswith(("http", "/", "~", "$", "-")) or "*" in s or "<" in s or "{" in s:
            continue
        if FILE.match(s) or (s.endswith("/") and re.match(r"^[\w./-]+/$", s)):
            out.append(s)
    return out


def named_paths() -> List[str]:
    """Every path the doc names, as 'name' or 'name in folder/' when a line (a table row) names
    its folder: there a bare module name is looked up in that folder of overlay_manager/."""
    out = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        spans = _spans(line)
        folders = [s for s in spans if s.endswith("/")]
        for s in spans:
            out.append(s if s.endswith("/") or "/" in s or not folders else f"{s} in {' '.join(folders)}")
    return sorted(set(out))


def exists(name: str) -> bool:
    """name exists under one of BASES; '<module> in <a>/ <b>/' also under overlay_manager/<a>/ or <b>/."""
    name, _, folders = name.partition(" in ")
    bases = BASES + [f"overlay_manager/{f}" for f in folders.split()]
    return any((ROOT / base / name).exists() or (DOC.parent / name).exists() for base in bases)


def test_the_doc_names_paths():
    assert len(named_paths()) > 40


@pytest.mark.parametrize("name", named_paths())
def test_named_path_exists(name):
    assert exists(name), f"docs/ARCHITECTURE.md names {name}, which is not in the tree (looked in {BASES})"


def test_a_missing_path_is_caught():
    assert not exists("overlay_manager/no_such_module.py")
    assert not exists("peers.py")  # a module is named with its layer folder
    assert exists("core/peers.py") and exists("lab/") and exists("src/link_aware_stream.cpp")


# ----- every doc: the package's own paths and module names ------------------------------------
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.rst"] + sorted((ROOT / "docs").glob("*.md"))
PACKAGE_PATH = re.compile(r"(?<![\w/.])overlay_manager/[a-z_][\w/]*(?:\.py)?")  # not overlay_manager/Peer (a type)
MODULE_NAME = re.compile(r"(?<![\w/.])overlay_manager(?:\.[a-z_]\w*)+")
NOT_MODULES = ("overlay_manager.msg", "overlay_manager.srv", "overlay_manager.conf")
"""Dotted names that are no Python module of the tree: the generated messages, a file name."""


def module_exists(dotted: str) -> bool:
    """overlay_manager.a.b[.name]: a package or module of the tree, or a name inside a module."""
    if dotted.startswith(NOT_MODULES):
        return True
    parts = dotted.split(".")
    for k in range(len(parts), 1, -1):
        p = ROOT.joinpath(*parts[:k])
        if p.with_suffix(".py").exists():
            return k >= len(parts) - 1  # the module or a name inside it, not a module path that is gone
        if (p / "__init__.py").exists():  # a package: itself, or a name its __init__ defines
            return k == len(parts) or (k == len(parts) - 1
                                       and re.search(rf"\b{parts[-1]}\b", (p / "__init__.py").read_text()) is not None)
    return False


def doc_names() -> List[str]:
    """'doc: name' for every package path and dotted module name in a code span of a doc (the
    changelog's "``old`` -> ``new``" lines name old modules on purpose: only new names are checked)."""
    out = set()
    for doc in DOCS:
        for line in doc.read_text(encoding="utf-8").splitlines():
            if doc.suffix == ".rst":
                line = re.sub(r"``[^`]+``\s*->", "", line)  # an old name, on purpose
            for span in re.findall(r"`+([^`]+)`+", line):
                out.update(f"{doc.name}: {m}" for m in PACKAGE_PATH.findall(span) + MODULE_NAME.findall(span))
    return sorted(out)


def test_the_docs_name_modules():
    assert len(doc_names()) > 20


@pytest.mark.parametrize("entry", doc_names())
def test_doc_names_a_module_of_the_tree(entry):
    doc, name = entry.split(": ", 1)
    found = module_exists(name) if "/" not in name else (ROOT / name.rstrip("/")).exists()
    assert found, f"{doc} names {name}, which is not in the tree (write the module's path in its layer folder)"


def test_an_old_module_name_is_caught():
    assert not module_exists("overlay_manager.monitor.poll")          # a name in a package, not a module
    assert not module_exists("overlay_manager.peers.PeerState")       # the module moved to core/
    assert module_exists("overlay_manager.core.peers.PeerState") and module_exists("overlay_manager.lab.campus.core")
    assert module_exists("overlay_manager.core.validation.ConfigError")  # the package names it


# ----- sources: Python docstrings and comments, C++ comments ----------------------------------
PY_DIRS = ("overlay_manager", "test", "scripts", "cfg")
CPP_DIRS = ("src", "include", "test")
NOT_SCANNED = {"__pycache__", "artifacts", "corpus"}
"""Folders whose files are not sources of the repository (byte code, run output, fuzz inputs)."""
SOURCE_PATH = re.compile(r"(?<![\w/.$@<{~:-])([\w.-]+(?:/[\w.-]+)*/?)(?![\w/(<])")
PATH_EXT = re.compile(r"\.(py|cpp|h|test|launch|md|msg|srv|cfg|ui|yaml|xml|in|txt|rst|service|conf)$")
BARE_EXT = re.compile(r"^[\w-]+\.(py|cpp|h|test|launch|msg|srv|cfg|ui)$")
NOT_IN_TREE: Dict[str, str] = {
    "turbojpeg.h": "libturbojpeg's header (#include <turbojpeg.h>)",
    "docs/x.md": "a placeholder page in the docs checks' docstrings",
}
"""Names a source may write that are no file of the repository, and why."""


def _tree_dirs() -> set:
    """Names of the repository's folders (a path whose first folder is none of them is not ours:
    headscale's derp/derpmap.yaml, tailscale's cmd/tailscaled/, ROS's sensor_msgs/...)."""
    out = set()
    for _, dirnames, _ in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in NOT_SCANNED]
        out.update(dirnames)
    return out


TREE_DIRS = _tree_dirs()


def _sources(folders: Tuple[str, ...], python: bool) -> List[Path]:
    out = []
    for folder in folders:
        for p in sorted((ROOT / folder).rglob("*")):
            if not p.is_file() or NOT_SCANNED & set(p.relative_to(ROOT).parts):
                continue
            if python and (p.suffix in (".py", ".cfg") or (p.suffix == "" and folder == "scripts"
                                                           and p.read_bytes()[:64].startswith(b"#!")
                                                           and b"python" in p.read_bytes()[:64])):
                out.append(p)
            elif not python and p.suffix in (".cpp", ".h"):
                out.append(p)
    return out


def python_texts(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python file."""
    src = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(src, str(path))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield first.lineno, first.value.value
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


CPP_TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


def cpp_comments(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, text) of every comment of a C++ file (string and character literals skipped)."""
    src = path.read_text(encoding="utf-8", errors="replace")
    for m in CPP_TOKEN.finditer(src):
        if m.group().startswith("/"):
            yield src.count("\n", 0, m.start()) + 1, m.group()


def path_names(text: str) -> Iterator[str]:
    """Repository paths a comment names: ``folder/.../file.ext`` or ``folder/`` whose first folder is
    one of the tree's, and bare module, source, message or launch file names. Not: ROS names and
    types (``sensor_msgs/Image``), dotted module names, paths outside the repository, globs."""
    for m in SOURCE_PATH.finditer(text):
        s = m.group(1).rstrip(".")
        if "/" in s:
            if s.split("/")[0] in TREE_DIRS and (PATH_EXT.search(s) or s.endswith("/")):
                yield s
        elif BARE_EXT.match(s) and not (s.endswith((".msg", ".srv")) and s[:1].islower()):
            yield s  # (overlay_manager.msg is a module, Peer.msg a message)


def source_exists(name: str, source: Path) -> bool:
    """name from a comment of source: relative to source's folder or one above it (a module's
    siblings, or a module of a sibling folder from the lab's benchmarks), or to one of BASES."""
    if name in NOT_IN_TREE:
        return True
    bases = [source.parent, *[p for p in source.parent.parents if p == ROOT or ROOT in p.parents]]
    return any((b / name.rstrip("/")).exists() for b in bases + [ROOT / b for b in BASES])


def source_names() -> List[str]:
    """'file:line: name' for every repository path a Python docstring or comment or a C++ comment names."""
    out = set()
    for python, folders in ((True, PY_DIRS), (False, CPP_DIRS)):
        for path in _sources(folders, python):
            texts = python_texts(path) if python else cpp_comments(path)
            for line, text in texts:
                for name in path_names(text):
                    out.add(f"{path.relative_to(ROOT)}:{line}: {name}")
    return sorted(out)


def test_the_sources_name_paths():
    assert len(source_names()) > 100


@pytest.mark.parametrize("entry", source_names())
def test_source_names_a_file_of_the_tree(entry):
    where, name = entry.rsplit(": ", 1)
    source = ROOT / where.split(":")[0]
    assert source_exists(name, source), (
        f"{where} names {name}, which is not in the tree (looked beside it, in the folders above it and in "
        f"the repository's main folders): write the path the file has now, with its folder (ros/messages.py)")


def test_a_stale_source_name_is_caught():
    wire = ROOT / "overlay_manager" / "ros" / "wire.py"
    assert list(path_names("built in node_messages.py (see monitor/peer_rows.py, docs/node.md)")) == [
        "node_messages.py", "monitor/peer_rows.py", "docs/node.md"]
    assert not source_exists("node_messages.py", wire) and not source_exists("lab/bench_node.py", wire)
    assert source_exists("messages.py", wire) and source_exists("core/peers.py", wire)
    assert source_exists("test/rostest/node.test", wire) and source_exists("lab/campus/", wire)
    assert not list(path_names("sensor_msgs/Image, overlay_manager/PeerList, derp/derpmap.yaml, "
                               "/etc/overlay_manager/robot.yaml, lab/bench*.py, image/link_aware, a/b"))
    src = 'x = "http://a/b.cpp"; // see src/gone.cpp\n/* and\n   include/x.h */ char c = \'"\';'
    f = ROOT / "test" / "unit" / "_paths_probe_tmp.cpp"
    try:
        f.write_text(src)
        assert [(n, list(path_names(t))) for n, t in cpp_comments(f)] == [
            (1, ["src/gone.cpp"]), (2, ["include/x.h"])]
    finally:
        f.unlink()


# ----- plugin XMLs: the libraries and classes they name ---------------------------------------
PLUGIN_XMLS = ("plugin.xml", "nodelet_plugins.xml", "image_transport_plugins.xml")
CMAKE = ROOT / "CMakeLists.txt"


def cmake_libraries() -> Dict[str, List[str]]:
    """library target -> its source files, from CMakeLists.txt's add_library(...) (${PROJECT_NAME}
    expanded)."""
    text = re.sub(r"#[^\n]*", "", CMAKE.read_text(encoding="utf-8"))
    project = re.search(r"project\(\s*(\w+)", text).group(1)
    out = {}
    for m in re.finditer(r"add_library\(\s*([^\s)]+)([^)]*)\)", text):
        words = m.group(2).split()
        out[m.group(1).replace("${PROJECT_NAME}", project)] = [w for w in words if w.endswith((".cpp", ".cc"))]
    return out


def plugin_classes() -> List[Tuple[str, str, str, str]]:
    """(xml, library path, class type, base class type) of every class of the plugin XMLs."""
    out = []
    for name in PLUGIN_XMLS:
        root = ET.parse(str(ROOT / name)).getroot()
        libraries = [root] if root.tag == "library" else root.findall("library")
        for lib in libraries:
            for cls in lib.findall("class"):
                out.append((name, lib.get("path", ""), cls.get("type", ""), cls.get("base_class_type", "")))
    return out


def test_package_xml_exports_the_plugin_xmls():
    exported = re.findall(r'plugin="\$\{prefix\}/([^"]+)"', (ROOT / "package.xml").read_text(encoding="utf-8"))
    assert sorted(exported) == sorted(PLUGIN_XMLS)
    assert all((ROOT / x).is_file() for x in exported)


@pytest.mark.parametrize("xml,library,cls,base", plugin_classes(), ids=lambda v: str(v))
def test_plugin_class_is_built(xml, library, cls, base):
    if library == ".":  # a Python class (rqt): module path and class name
        module, _, name = cls.rpartition(".")
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        assert path.is_file(), f"{xml}: class {cls}: no module {module} ({path.relative_to(ROOT)})"
        assert re.search(rf"^class {name}\b", path.read_text(encoding="utf-8"), re.M), \
            f"{xml}: {path.relative_to(ROOT)} defines no class {name}"
        return
    target = re.sub(r"^lib/lib", "", library)
    libraries = cmake_libraries()
    assert library.startswith("lib/lib") and target in libraries, (
        f"{xml}: library {library} is no add_library target of CMakeLists.txt ({sorted(libraries)})")
    export = re.compile(rf"PLUGINLIB_EXPORT_CLASS\(\s*{re.escape(cls)}\s*,\s*{re.escape(base)}\s*\)")
    sources = [s for s in libraries[target] if export.search((ROOT / s).read_text(encoding="utf-8"))]
    assert sources, (f"{xml}: no source of {target} ({', '.join(libraries[target])}) has "
                     f"PLUGINLIB_EXPORT_CLASS({cls}, {base})")


def test_plugin_xml_checks_see_a_missing_class():
    assert ("nodelet_plugins.xml", "lib/liboverlay_manager_image_nodelets", "overlay_manager::LinkAwareEncoder",
            "nodelet::Nodelet") in plugin_classes()
    assert "src/link_aware_transport.cpp" in cmake_libraries()["overlay_manager_image_transport"]
    with pytest.raises(AssertionError, match="PLUGINLIB_EXPORT_CLASS"):
        test_plugin_class_is_built("x.xml", "lib/liboverlay_manager_image_transport", "overlay_manager::Gone",
                                   "image_transport::PublisherPlugin")
    with pytest.raises(AssertionError, match="no add_library target"):
        test_plugin_class_is_built("x.xml", "lib/liboverlay_manager_gone", "overlay_manager::LinkAwareEncoder",
                                   "nodelet::Nodelet")
    with pytest.raises(AssertionError, match="defines no class"):
        test_plugin_class_is_built("plugin.xml", ".", "overlay_manager.dashboard.plugin.Gone", "rqt_gui_py::Plugin")
