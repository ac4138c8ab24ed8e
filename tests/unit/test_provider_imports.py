"""Light parsing (issue 40, item 1): importing any module of the provider -- operators, sensors,
triggers, the notifier, hooks, the TaskFlow decorator, the example DAGs -- loads none of pyarrow, numpy, pandas, pyspark.

Why: the Airflow DAG processor imports every module a DAG file imports, on every parse of that
file, and the triggerer imports the trigger modules; pyarrow and numpy alone cost about 0.3 s of a
cold process, and pandas or pyspark more. The work loads them where it runs (``execute``, a hook
method).

How: in this interpreter an earlier test has long loaded all four, so one fresh interpreter
imports Airflow's authoring API (``airflow.sdk``: several seconds of a cold process on this
machine, so once, not once per module), checks that none of the four is loaded yet, and forks one
child per provider module; each child imports its module into a process that has imported no
other module of the provider, and reports what of the four it finds in ``sys.modules``. A real
parse of the example DAGs in a fresh interpreter (``DagBag``) is checked the same way in
``tests/airflow/test_dag_integrity.py::test_parsing_does_no_work``.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_provider_bucketindex
from airflow_provider_bucketindex import get_provider_info

pytestmark = pytest.mark.unit

#: what parsing must not load
HEAVY = ("pyarrow", "numpy", "pandas", "pyspark")

#: modules whose purpose is pyarrow work and that no DAG file, operator, sensor, trigger, notifier
#: or hook imports at module level: the demo's sample batches and oracle (the demo runner imports
#: it inside ``main``)
EXEMPT = {"airflow_provider_bucketindex.demo.sample_data": "the demo's pyarrow batches and oracle"}

#: argv: modules; prints ``{module: [heavy modules loaded] or "error text"}`` as JSON
_PROBE = f"""
import importlib, json, os, sys, traceback
HEAVY = {HEAVY!r}
import airflow.sdk as sdk
for name in ("DAG", "BaseOperator", "BaseHook", "BaseSensorOperator", "BaseNotifier", "Asset", "Param"):
    getattr(sdk, name)
import airflow.triggers.base
before = [m for m in HEAVY if m in sys.modules]
assert not before, f"airflow.sdk alone loaded {{before}}"
assert not any(m.startswith("airflow_provider_bucketindex.") for m in sys.modules)
result = {{}}
for module in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(module)
            out = [m for m in HEAVY if m in sys.modules]
        except BaseException:
            out = traceback.format_exc()
        with os.fdopen(w, "w") as f:
            json.dump(out, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        result[module] = json.load(f)
    os.waitpid(pid, 0)
print(json.dumps(result))
"""

def _provider_modules() -> list[str]:
    """Every module of the package, found on disk (a module added later is covered too)."""
    names = [airflow_provider_bucketindex.__name__]
    for info in pkgutil.walk_packages(airflow_provider_bucketindex.__path__, prefix="airflow_provider_bucketindex."):
        names.append(info.name)
    return sorted(names)


MODULES = _provider_modules()


def test_the_walk_finds_every_module_airflow_is_told_about() -> None:
    """The parametrisation below covers what the provider info registers (operators, sensors,
    triggers, hooks, the notifier, the TaskFlow decorator) and the packaged example DAGs."""
    info = get_provider_info()
    declared = {m for kind in ("operators", "sensors", "triggers", "hooks") for group in info[kind]
                for m in group["python-modules"]}
    declared |= {path.rpartition(".")[0] for path in info["notifications"]}
    declared |= {d["class-name"].rpartition(".")[0] for d in info["task-decorators"]}
    assert "airflow_provider_bucketindex.decorators.upsert" in declared
    examples = {f"airflow_provider_bucketindex.dags.{p.stem}"
                for p in Path(airflow_provider_bucketindex.__file__).parent.joinpath("dags").glob("*.py")
                if p.stem != "__init__"}
    assert len(examples) >= 5 and len(declared) >= 11
    assert declared | examples <= set(MODULES) - set(EXEMPT)


def test_importing_any_provider_module_loads_no_heavy_library(tmp_path: Path) -> None:
    """On the code before this test (2026-11-28), every operator module, the hook, the notifier,
    ``lineage``, ``storage`` and the five example DAGs loaded pyarrow and numpy: ``storage``
    imports ``spark_jobs.io.storage``, whose package ``__init__`` imported
    ``spark_jobs.io.filesystem`` (pyarrow). Sensors and triggers were already light.

    One test, one probe (several seconds of Airflow's import), every offender named at once.
    Airflow gets a private home (its first import writes a default ``airflow.cfg`` there) and
    none of its own example DAGs."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    control = "spark_jobs.io.filesystem"  # imports pyarrow: the probe must see it
    modules = [m for m in MODULES if m not in EXEMPT]
    p = subprocess.run([sys.executable, "-c", _PROBE, *modules, control], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    imported = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(imported) == {*modules, control}
    assert {"pyarrow", "numpy"} <= set(imported.pop(control)), "the probe does not see a heavy import"
    failed = {m: out for m, out in imported.items() if not isinstance(out, list)}
    assert not failed, "".join(f"importing {m} failed:\n{out}" for m, out in failed.items())
    heavy = {m: out for m, out in imported.items() if out}
    assert heavy == {}, f"importing these modules loaded {HEAVY} modules: {heavy}"
