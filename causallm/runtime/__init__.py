"""The graph runtime: what libnntrainer is to the C++ app.

- ``properties``: ``withKey`` and the typed ``key=value`` property specs;
- ``registry``: layer type string -> layer class;
- ``layer``: the layer contract (``Layer``, ``InitLayerContext``, ``RunLayerContext``);
- ``node``: ``LayerNode``, what ``createLayer`` returns;
- ``graph``: ``Model``, the user-facing graph (addLayer, addStage, compile, initialize, run,
  save/load, getKVCaches);
- ``compiler``: realizing, checking, ordering and finalizing the layers, split into stages;
- ``planner``: the activation buffers, reused once their readers have run;
- ``runner``: one step of one stage over the compiled layers;
- ``kv_cache``: the KV caches, objects with a kind (self or cross) and an owner layer;
- ``context``: a model's context (MAX_SEQ_LEN), the new tokens that fit in it and the memory
  its KV caches need;
- ``graphviz``: the compiled graph as Graphviz DOT (or SVG through ``dot``).

No module here imports a layer or a model: layers register themselves (``layers/``).
"""
