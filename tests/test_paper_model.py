"""The paper's model built from registered layers only: the code in docs/porting.md ("The
paper's model, from registered layers") runs as written, its parameter totals are the formula's
(an encoder layer 12D^2 + 13D, a decoder layer 16D^2 + 19D), and it decodes consistently."""

import os
import re

import numpy as np
import pytest
from parity import ROOT

DOC = open(os.path.join(ROOT, "docs", "porting.md"), encoding="utf-8").read()
CODE = re.search(r"## The paper's model, from registered layers\n.*?```python\n(.*?)```", DOC,
                 re.S).group(1)
SCOPE = {}
exec(CODE, SCOPE)
paper_transformer = SCOPE["paper_transformer"]


def totals(text):
    """{group: parameters} from summarize()'s last lines."""
    return {key: int(value.replace(",", "")) for key, value in
            re.findall(r"^  (\S+): ([\d,]+)$", text, re.M)}


@pytest.mark.parametrize("N, D, H, V", [(2, 64, 4, 300), (3, 32, 2, 50)])
def test_parameters_are_the_formula(N, D, H, V):
    model = paper_transformer(N=N, D=D, H=H, V=V, T=16)
    got = totals(model.summarize(open(os.devnull, "w")))
    assert got["encoder_layer*"] == N * (12 * D * D + 13 * D)
    assert got["decoder_layer*"] == N * (16 * D * D + 19 * D)
    assert got["other"] == V * D  # the one embedding, shared by the output layer


def test_the_paper_model_decodes_as_a_recompute():
    model = paper_transformer(N=2, D=32, H=4, V=40, T=12)
    model.initialize()
    rng = np.random.default_rng(0)
    for spec in model.getWeightSpecs():
        w = rng.standard_normal(spec.shape).astype(np.float32)
        model.setWeight(spec.full_name, 1 + 0.1 * w if spec.full_name.endswith(":gamma")
                        else 0.2 * w)
    model.incremental_inference(1, [np.array([[3, 9, 27, 5, 1]], np.float32)], None, None, 0, 5,
                                stage="encoder")
    seq = [0, 7, 22, 13, 31]
    cached = [model.incremental_inference(1, [np.array([[t]], np.float32)], None, None, k,
                                          k + 1, stage="decoder")[0] for k, t in enumerate(seq)]
    full = model.incremental_inference(1, [np.array([seq], np.float32)], None, None, 0, len(seq),
                                       stage="decoder")[0]
    np.testing.assert_allclose(full, cached[-1], rtol=1e-4, atol=1e-5)
