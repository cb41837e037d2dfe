"""``relative_position_bias``: T5's bucketed relative position bias (HF ``compute_bias``).

    out[b, 0, h, C + r] = W[bucket(r), h]        r = key position - query position, C = T - 1

for the relative positions a step of queries [from_, to) needs against keys [0, to)
(``bucket``: causallm/kernels/position_bias.py; bidirectional buckets for an encoder, causal ones
for a decoder). The bias depends on positions only, so one layer per stack computes it and
every ``mha_core`` of that stack adds it to its scores (its 4th input), as transformers computes
it in the first block and hands it to the others. Cross-attention takes none.

Input: any tensor of the stage (the token ids), which fixes the batch and the stage; output
``(B, 1, num_heads, 2T - 1)``. Weight ``weight`` ``(num_buckets, num_heads)``, HF
``relative_attention_bias.weight`` as it is. Properties: ``num_heads`` and ``max_timestep``
(required; T, the attention layers' max_timestep), ``num_buckets`` (32), ``max_distance``
(128), ``bidirectional`` (true).
"""

from causallm.kernels.position_bias import position_bias, relative_position_buckets
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import bool_, uint


class RelativePositionBiasLayer(Layer):
    type = "relative_position_bias"
    properties = {"num_heads": uint(required=True), "max_timestep": uint(required=True),
                  "num_buckets": uint(32), "max_distance": uint(128), "bidirectional": bool_(True)}

    def finalize(self, context):
        p = self.props
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input (any tensor of its stage), got {len(dims)}")
        heads, T = p["num_heads"], p["max_timestep"]
        if heads < 1 or T < 1:
            raise context.error("num_heads and max_timestep must be at least 1")
        buckets = p["num_buckets"] // (2 if p["bidirectional"] else 1)
        if buckets < 2 or p["max_distance"] < 1:
            raise context.error(f"num_buckets {p['num_buckets']} and max_distance "
                                f"{p['max_distance']} leave no exact bucket")
        self.max_timestep = T
        self.buckets = relative_position_buckets(T, p["num_buckets"], p["max_distance"],
                                                 p["bidirectional"])
        context.requestWeight("weight", (p["num_buckets"], heads))
        context.setOutputDimensions([TensorDim(dims[0].batch, 1, heads, 2 * T - 1)])

    def incremental_forwarding(self, context, from_, to):
        if to > self.max_timestep:
            raise context.error(f"position {to} is past max_timestep {self.max_timestep}")
        center = self.max_timestep - 1
        position_bias(context.weights[0], self.buckets, context.outputs[0],
                      center - (to - 1), center + (to - from_))
