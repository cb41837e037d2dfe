"""Factory: architecture string -> model creator (Applications/CausalLM/factory.h).

    Factory.Instance().registerModel("LlamaForCausalLM", lambda cfg, gen, nntr: CausalLM(cfg, gen, nntr))
    model = Factory.Instance().create("LlamaForCausalLM", cfg, gen, nntr)   # None if unknown
"""

from __future__ import annotations

import sys
from typing import Callable


class Factory:
    _instance: "Factory | None" = None

    def __init__(self) -> None:
        self._creators: dict[str, Callable] = {}

    @classmethod
    def Instance(cls) -> "Factory":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def registerModel(self, key: str, creator: Callable) -> None:
        self._creators[key] = creator

    def create(self, key: str, cfg, generation_cfg, nntr_cfg):
        creator = self._creators.get(key)
        return None if creator is None else creator(cfg, generation_cfg, nntr_cfg)

    def getRegistered(self) -> list[str]:
        return sorted(self._creators)

    def printRegistered(self, out=None) -> None:
        out = out or sys.stdout
        for key in self.getRegistered():
            out.write(f"  {key}\n")
