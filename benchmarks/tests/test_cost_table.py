"""The shipped FP8 cost table (``turbo_inductor/costs/``) is what ``benchmarks.cost_table`` makes of the committed
runs it names."""

import json

import pytest

from benchmarks import cost_table
from benchmarks.runs import RESULTS
from turbo_inductor import costs


@pytest.mark.cost_tables
def test_the_shipped_table_is_what_its_runs_make(tmp_path):
    shipped = json.loads((costs.HERE / "nvidia-h200.json").read_text())
    sources = {entry["source"].split(" ")[0] for kind in (costs.GROUPED_MM, costs.LINEAR) for entry in shipped[kind]}
    cost_table.main([str(RESULTS / name) for name in sorted(sources)] + ["--out", str(tmp_path)])
    assert json.loads((tmp_path / "nvidia-h200.json").read_text()) == shipped
