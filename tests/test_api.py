"""The README's Python example runs on every family: the Factory creates the model of any
registered architecture from its folder, and run() answers with a result whose record() holds
what the CLI prints as JSON."""

import os
import re

import pytest
from parity import FIXTURES, ROOT

from causallm.factory import Factory

README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
EXAMPLE = re.search(r"## From Python\n+```python\n(.*?)```", README, re.S).group(1)
FOLDERS = sorted(name for name in os.listdir(FIXTURES)
                 if os.path.isfile(os.path.join(FIXTURES, name, "config.json")))


def test_the_example_names_a_folder():
    assert '"path/to/model"' in EXAMPLE


@pytest.mark.slow
@pytest.mark.parametrize("name", FOLDERS)
def test_readme_example_runs_on_every_fixture(name, capsys):
    scope = {}
    exec(EXAMPLE.replace('"path/to/model"', repr(os.path.join(FIXTURES, name))), scope)
    result, model = scope["result"], scope["model"]
    record = result.record()
    assert record["prompt_ids"]
    if "generated_ids" in record:
        assert record["generated_ids"] and record["finish_reason"] in ("eos", "length",
                                                                        "cache_full")
        assert capsys.readouterr().out.endswith("\n")  # the text streamed
    else:
        assert record["dim"] == len(record["embedding"])
    assert model.architecture in Factory.Instance().getRegistered()
