"""Model classes registered from outside the repository: ``--plugin FILE.py`` and the
``causallm.models`` entry points of installed packages (factory.py).

Each plugin runs on a copy of a fixture folder whose config.json names the plugin's
architecture, through ``python main.py`` in a subprocess (so the process's Factory is the
plugin's alone), and must give the greedy tokens transformers produced for that folder.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from cli import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
EXAMPLE = os.path.join(ROOT, "examples", "plugin_nntr_qwen3.py")

MY_LLAMA = """\
from causallm.factory import Factory
from causallm.models.causal_lm import CausalLM


class MyLlamaCausalLM(CausalLM):
    architectures = "MyLlamaForCausalLM"


Factory.Instance().registerModel("MyLlamaForCausalLM", MyLlamaCausalLM)
"""


def renamed_copy(tmp_path, fixture, architecture):
    """A copy of tests/fixtures/<fixture> whose config.json names ``architecture``."""
    folder = tmp_path / fixture
    shutil.copytree(os.path.join(FIXTURES, fixture), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = [architecture]
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def transformers_tokens(fixture):
    ref = np.load(os.path.join(FIXTURES, fixture, "expected.npz"))
    return str(ref["prompt"]), ref["tokens"].tolist()


def greedy_ids(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_plugin_file_runs_its_architecture(tmp_path):
    folder = renamed_copy(tmp_path, "llama-gqa3", "MyLlamaForCausalLM")
    plugin = tmp_path / "my_llama.py"
    plugin.write_text(MY_LLAMA)
    prompt, tokens = transformers_tokens("llama-gqa3")

    without = run_cli(folder, prompt, "-n", 2, process=True)
    assert without.returncode == 2
    assert "unknown architecture 'MyLlamaForCausalLM'" in without.stderr

    record = greedy_ids(run_cli(folder, prompt, "--greedy", "-n", len(tokens), "--json",
                                "--plugin", plugin, process=True))
    assert record["architecture"] == "MyLlamaForCausalLM"
    assert record["generated_ids"] == tokens


@pytest.mark.slow
def test_the_porting_example_gives_transformers_qwen3_tokens(tmp_path):
    """examples/plugin_nntr_qwen3.py (docs/porting.md) on a Qwen3 checkpoint."""
    folder = renamed_copy(tmp_path, "qwen3-hd80", "NNTRQwen3ForCausalLM")
    prompt, tokens = transformers_tokens("qwen3-hd80")
    record = greedy_ids(run_cli(folder, prompt, "--greedy", "-n", len(tokens), "--json",
                                "--plugin", EXAMPLE, process=True))
    assert record["architecture"] == "NNTRQwen3ForCausalLM"
    assert record["generated_ids"] == tokens


@pytest.mark.slow
def test_the_porting_example_graph_has_the_fused_layer(tmp_path):
    folder = renamed_copy(tmp_path, "qwen3-hd80", "NNTRQwen3ForCausalLM")
    dot = tmp_path / "g.dot"
    p = run_cli(folder, "--graph", dot, "--plugin", EXAMPLE, process=True)
    assert p.returncode == 0, p.stderr
    text = dot.read_text()
    assert '"layer0_qkv" -> "layer0_q_norm";' in text  # output 0
    assert '"layer0_qkv" -> "layer0_k_norm" [label="(1)"];' in text
    assert '"layer0_qkv" -> "layer0_attention" [label="(2)"];' in text


def test_a_missing_plugin_is_a_one_line_error(tmp_path):
    p = run_cli("--plugin", tmp_path / "nope.py")
    assert p.returncode == 2
    assert p.stderr == f"error: --plugin {tmp_path / 'nope.py'}: no such file\n"


def test_a_plugin_that_raises_is_a_one_line_error(tmp_path):
    plugin = tmp_path / "broken.py"
    plugin.write_text("import math\nraise RuntimeError('no model here\\nsecond line')\n")
    p = run_cli("--plugin", plugin)
    assert p.returncode == 2
    assert p.stderr == f"error: --plugin {plugin}: import failed: RuntimeError: no model here\n"
    assert "causallm_plugin_broken" not in sys.modules

    plugin.write_text("def register(:\n")
    p = run_cli("--plugin", plugin)
    assert p.returncode == 2
    assert p.stderr.startswith(f"error: --plugin {plugin}: import failed: SyntaxError: ")
    assert p.stderr.count("\n") == 1


def installed_plugins(site):
    """A site folder as pip would leave it: two distributions with ``causallm.models`` entry
    points (a function, a module, one that fails to import) and their modules."""
    for dist, entry_points in [
            ("causallm_demo_models-1.2", """\
                [causallm.models]
                my_llama = causallm_demo_models:register
                other = causallm_demo_other
                """),
            ("causallm_broken_models-0.1", """\
                [causallm.models]
                broken = causallm_broken_models:register
                """)]:
        info = site / f"{dist}.dist-info"
        info.mkdir(parents=True)
        name, version = dist.split("-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\n"
                                       f"Version: {version}\n")
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    (site / "causallm_demo_models.py").write_text(MY_LLAMA.replace(
        'Factory.Instance().registerModel("MyLlamaForCausalLM", MyLlamaCausalLM)',
        'def register(factory):\n    factory.registerModel("MyLlamaForCausalLM", '
        'MyLlamaCausalLM)'))
    (site / "causallm_demo_other.py").write_text(
        "from causallm.factory import Factory\nfrom causallm.models.causal_lm import CausalLM\n"
        "Factory.Instance().registerModel('OtherLlamaForCausalLM', CausalLM)\n")
    (site / "causallm_broken_models.py").write_text("import no_such_module_here\n")


@pytest.mark.slow
def test_entry_points_of_installed_packages_register_models(tmp_path):
    site = tmp_path / "site"
    installed_plugins(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    listed = subprocess.run(
        [sys.executable, "-c", "from causallm.factory import Factory; "
                               "print(' '.join(Factory.Instance().getRegistered()))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert {"MyLlamaForCausalLM", "OtherLlamaForCausalLM", "LlamaForCausalLM"} <= \
        set(listed.stdout.split())
    assert listed.stderr == (
        "warning: entry point 'broken = causallm_broken_models:register' (causallm.models) of "
        "distribution 'causallm-broken-models 0.1' failed, skipped: ModuleNotFoundError: No "
        "module named 'no_such_module_here'\n")

    folder = renamed_copy(tmp_path, "llama-gqa3", "MyLlamaForCausalLM")
    prompt, tokens = transformers_tokens("llama-gqa3")
    p = run_cli(folder, prompt, "--greedy", "-n", len(tokens), "--json", env=env, process=True)
    assert greedy_ids(p)["generated_ids"] == tokens
    assert p.stderr.startswith("warning: entry point 'broken = ")
