"""The package's shape: its layers (every import points down), no import circles between edgerl
modules, no module over 500 lines.

Every import counts, wherever it stands: at the top, inside a function, under ``TYPE_CHECKING``.
An import names the module it reads (``from edgerl.hw import clocks`` names ``edgerl.hw.clocks``,
``from edgerl.config import Config`` names ``edgerl.config``) and the packages above it, whose
``__init__`` runs first (except the importing module's own packages, which have run already).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import edgerl

PACKAGE = Path(edgerl.__file__).parent
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The edgerl modules that module ``name`` (at ``path``) imports anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b` reads module a.b when there is one, else a
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                module = ".".join(parts[:i])
                if module in known and module != name and not name.startswith(module + "."):
                    found.add(module)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(name, path, known) for name, path in found.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()
    on_path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in on_path:
            return [*on_path[on_path.index(node) :], node]
        if node in done:
            return None
        on_path.append(node)
        for nxt in sorted(graph[node]):
            circle = visit(nxt)
            if circle:
                return circle
        on_path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        circle = visit(start)
        if circle:
            return circle
    return None


def test_the_import_graph_reads_imports_inside_functions_and_under_type_checking(tmp_path):
    src = tmp_path / "edgerl_demo.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from edgerl.run.train import Trainer\n"
        "def f():\n"
        "    from edgerl.hw import clocks\n"
        "    import edgerl.memories.replay\n"
    )
    known = {
        "edgerl.run.train",
        "edgerl.hw",
        "edgerl.hw.clocks",
        "edgerl.memories.replay",
        "edgerl.config",
    }
    assert imported("edgerl.demo", src, known) == {
        "edgerl.run.train",
        "edgerl.hw",  # its __init__ runs before edgerl.hw.clocks
        "edgerl.hw.clocks",
        "edgerl.memories.replay",
    }
    # a module's own package has been imported before it: not an edge
    assert imported("edgerl.hw.monitor", src, known) == {
        "edgerl.run.train",
        "edgerl.hw.clocks",
        "edgerl.memories.replay",
    }
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_two_edgerl_modules_import_each_other():
    circle = find_circle(import_graph())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_no_module_is_over_500_lines():
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them along a seam): {long}"


# The layers, from the ground up: a package imports only packages of lower layers (and its own
# modules); packages in one layer import nothing of each other. docs/development.md draws it.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "words"),  # one-sentence errors; counts and durations in words
    ("files",),  # atomic writes, tolerant readers, the checkpoint record
    ("config",),  # typed settings, their layers and presets, the learner table
    ("hw",),  # the machine: Jetson platform, clocks, load, CPUs, torch's device
    ("envs",),  # vector environments, ALE's async mode, preprocessing
    ("memories", "stream"),  # replay and rollout; the frame stream's format
    ("learners",),  # DQN, PQN, PPO, the GA: their policies, networks and fast updates
    ("policies",),  # a learned policy from any file, behind one interface
    ("play", "export"),  # playing a policy; writing and checking policy files
    ("report",),  # what a run reports and keeps: hooks, metrics, evaluations, status, run dir
    ("run",),  # the training loop: actor, pipelines, trainer, checkpoints
    ("fleet",),  # actors on other machines through Ray (the optional edgerl[fleet] extra)
    ("service",),  # the session around a run, the daemon, logging
    ("display",),  # the viewer, the console renderer, the curves
    ("measure", "doctor", "serve"),  # edgerl bench; edgerl doctor; edgerl serve (the web page)
    ("cli",),  # the command line
]
LAYER = {package: i for i, packages in enumerate(LAYERS) for package in packages}


def package_of(module: str) -> str | None:
    """``edgerl.run.train`` -> ``run``; None for ``edgerl`` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    """Every import that does not point down the layer table, as ``a -> b (why)``."""
    found = []
    for name, imports in sorted(graph.items()):
        own = package_of(name)
        for target in sorted(imports):
            other = package_of(target)
            if own is None or other is None or other == own:
                continue
            if LAYER[other] > LAYER[own]:
                found.append(f"{name} -> {target} (up: {other} is above {own})")
            elif LAYER[other] == LAYER[own]:
                found.append(f"{name} -> {target} (sideways: {own} and {other} share a layer)")
    return found


# Asking which kind of memory a learner has (a replay, a rollout) is the learner's business: the
# rest of the package asks what it needs to know (Memory.keeps_steps, Learner.steps_per_unit,
# LearnerInfo's own_num_envs and remote_actors, the learner module's cost model), so that the next
# learner is its module, its memory and its registry line.
MEMORY_KIND = re.compile(
    r"uses_replay\(|learner_info\([^)]*\)\.memory\b|\binfo\.memory\b"
    r"|isinstance\([^)]*\b(ReplayBuffer|RolloutBuffer)\b"
)
MEMORY_KIND_ALLOWED = {
    # its smoke checks exercise each memory itself: a replay's samples, a rollout's learning
    "edgerl.doctor.deep",
}


def memory_kind_tests() -> set[str]:
    """Modules outside learners/ and memories/ (and the registry) that test the memory's kind."""
    found = set()
    for name, path in modules().items():
        if (
            name.startswith(("edgerl.learners", "edgerl.memories"))
            or name == "edgerl.config.learners"
        ):
            continue
        if MEMORY_KIND.search(path.read_text()):
            found.add(name)
    return found


def test_only_learners_and_memories_ask_which_kind_of_memory_a_learner_has():
    assert memory_kind_tests() == MEMORY_KIND_ALLOWED
    assert MEMORY_KIND.search("if isinstance(self.memory, ReplayBuffer):")  # the check can fail
    assert MEMORY_KIND.search('if learner_info(cfg.agent.algo).memory == "rollout":')


# A learner's name (a string such as "dqn") belongs to learners/, memories/ and config/: the loop
# and what is around it ask the learner or its registry line what they need (issue 55); measure/
# and doctor/ measure and check the configured learner, or the one whose update runs in modes
# (learners.kinds.modes_learner). files/ keeps the names of format 1's learners: a checkpoint
# format's history (config/ sits above it).
NO_LEARNER_NAMES = (
    "run",
    "report",
    "serve",
    "display",
    "play",
    "export",
    "fleet",
    "service",
    "stream",
    "measure",
    "doctor",
    "cli",
    "envs",
    "hw",
    "policies",
    "errors",
    "words",
)


def learner_names_in(packages: tuple[str, ...]) -> list[str]:
    """``module:line`` of each string literal in ``packages`` that is a learner's name."""
    from edgerl.config.learners import LEARNERS

    found = []
    for name, path in modules().items():
        if package_of(name) not in packages:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in LEARNERS:
                found.append(f"{name}:{node.lineno} ({node.value!r})")
    return found


def test_the_loop_and_what_shows_or_ships_it_name_no_learner():
    assert learner_names_in(NO_LEARNER_NAMES) == []
    assert learner_names_in(("config",))  # the check can fail: the registry names them


def test_every_package_has_a_layer_and_says_what_it_holds_in_one_line():
    packages = {package_of(name) for name in modules()} - {None}
    assert packages == set(LAYER), (
        f"without a layer: {sorted(packages - set(LAYER))}; gone: {sorted(set(LAYER) - packages)}"
    )
    for package in packages:
        init = PACKAGE / package / "__init__.py"
        if init.exists():
            doc = ast.get_docstring(ast.parse(init.read_text()))
            assert doc, f"edgerl/{package}/__init__.py has no docstring saying what it holds"


def test_every_import_points_down_the_layer_table():
    offending = against_the_layers(import_graph())
    assert not offending, "imports against the layers:\n" + "\n".join(offending)


def test_the_layer_check_names_an_import_that_climbs():
    graph = {
        "edgerl.hw.monitor": {"edgerl.report.hooks", "edgerl.config"},
        "edgerl.report.hooks": {"edgerl.config"},
        "edgerl.play": {"edgerl.export"},
        "edgerl.config": set(),
        "edgerl.export": set(),
    }
    assert against_the_layers(graph) == [
        "edgerl.hw.monitor -> edgerl.report.hooks (up: report is above hw)",
        "edgerl.play -> edgerl.export (sideways: play and export share a layer)",
    ]


def test_play_and_export_share_the_policies_and_import_nothing_of_each_other():
    """edgerl.export checks its files by playing them through edgerl.policies, as edgerl.play
    plays them; neither imports the other."""
    graph = import_graph()
    crossing = {
        name: sorted(b for b in imports if b.split(".")[:2] == ["edgerl", other])
        for name, imports in graph.items()
        for own, other in (("play", "export"), ("export", "play"))
        if name.split(".")[:2] == ["edgerl", own]
    }
    assert not any(crossing.values()), {k: v for k, v in crossing.items() if v}
    assert "edgerl.policies.torch" in graph["edgerl.export.run"]
    assert "edgerl.policies" in graph["edgerl.play.loop"]


def test_watching_a_run_does_not_load_pytorch():
    """`edgerl view` and `edgerl status` start in a fraction of a second on a board: the viewer,
    the console renderer and the status reader import nothing that loads torch (1.2 s more here,
    several seconds on a Jetson)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import edgerl.display.viewer, edgerl.display.render, edgerl.report.status\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert r.stdout.strip() == "[]", f"torch loaded by the watching modules: {r.stdout}"
