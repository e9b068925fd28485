"""What a conversion writes: one frozen object, built once (by the CLI, or by ``convert_paths``
from its keywords) and passed to every step and worker."""

from __future__ import annotations

from dataclasses import dataclass

from chakra_hooks.converter.targets import Target, parse_target


@dataclass(frozen=True)
class ConvertOptions:
    prefix: str = "chakra"  # output files: <prefix>.<rank>.et
    target: Target = Target.FULL  # who reads the ETs (converter/targets/)
    write_json: bool = False  # also each ET as ASTRA-sim's JSON workload (<prefix>.<rank>.json)
    keep_mem: bool = False  # astra-sim: keep MEM_LOAD / MEM_STORE nodes
    gaps: bool = True  # the slack between ops as gap nodes (linker/enrich/gaps.py)
    force_pair: bool = False  # link an ET and a Kineto trace however few ops match

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", parse_target(self.target))  # a name is accepted
