"""The graph runtime: what libnntrainer is to the C++ app.

- ``properties``: ``withKey`` and the typed ``key=value`` property specs;
- ``registry``: layer type string -> layer class;
- ``layer``: the layer contract (``Layer``, ``InitLayerContext``, ``RunLayerContext``);
- ``node``: ``LayerNode``, what ``createLayer`` returns;
- ``graph``: ``Model``, the graph (addLayer, compile, initialize, run, save/load).

No module here imports a layer or a model: layers register themselves (``layers/``).
"""
