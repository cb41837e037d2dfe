"""``positional_embedding``: learned absolute position (and token type) embeddings, added.

    out[b, i] = x[b, i] + P[offset + p]                         i in [0, step)
    out[b, i] = (x[b, i] + T[token_type]) + P[offset + p]       with token types

GPT-2's ``wte + wpe``, BERT's ``BertEmbeddings`` (word + token type + position) and BART's
learned positions (``BartLearnedPositionalEmbedding``: the table has 2 extra rows in front,
``offset`` 2); the word embedding ``x`` comes from ``embedding_layer``. Positions are absolute,
so row i of batch b at position p (``context.step.positions[b, i]``: from_ + i for a step
over [from_, to)) uses row ``offset + p`` of P.

Input ``(B, 1, H, W)``; output the same. Weights, in order: ``Embedding`` (P, W) =
[max_position_embeddings, hidden], the PyTorch layout (P counts the offset rows); then, only
if ``type_vocab_size`` > 0, ``TokenTypeEmbedding`` (type_vocab_size, W). Properties:
``max_position_embeddings`` (required: the table's rows), ``offset`` (0), ``type_vocab_size``
(0 = no token types), ``token_type`` (0: the type id of every token; HF's default
token_type_ids are all zeros). A position past the table is an error naming the layer. Not an
nntrainer CausalLM layer: added for GPT-2, BART and the encoder models.
"""

import numpy as np

from causallm.kernels.embedding_sum import position_add
from causallm.runtime.layer import Layer
from causallm.runtime.properties import uint

NO_TYPE = np.zeros(0, dtype=np.float32)


class PositionalEmbeddingLayer(Layer):
    type = "positional_embedding"
    layer_impl = True
    properties = {"max_position_embeddings": uint(required=True), "offset": uint(0),
                  "type_vocab_size": uint(0), "token_type": uint(0)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        p = self.props
        self.positions, types = p["max_position_embeddings"], p["type_vocab_size"]
        self.offset = p["offset"]
        if self.positions <= self.offset:
            raise context.error(f"max_position_embeddings {self.positions} leaves no row past "
                                f"offset {self.offset}")
        if types and p["token_type"] >= types:
            raise context.error(f"token_type {p['token_type']} is out of range for "
                                f"type_vocab_size {types}")
        width = dims[0].width
        context.requestWeight("Embedding", (self.positions, width))
        self.has_types = types > 0
        if self.has_types:
            context.requestWeight("TokenTypeEmbedding", (types, width))
        context.setOutputDimensions([dims[0]])

    def incremental_forwarding(self, context, from_, to):
        step = context.step
        if self.offset + step.end > self.positions:
            raise context.error(f"position {step.end - 1} is past max_position_embeddings "
                                f"{self.positions - self.offset}")
        type_row = context.weights[1][self.props["token_type"]] if self.has_types else NO_TYPE
        position_add(context.inputs[0], context.weights[0], type_row, context.outputs[0],
                     to - from_, step.positions, self.offset)
