import os
import pathlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

Spec = Union[Mapping[str, Any], str, os.PathLike[str], None]
Report = Dict[str, Any]

class VramguardError(RuntimeError):
    errors: List[str]
    problems: List[Dict[str, Any]]
    exit_code: Optional[int]
    def __init__(
        self,
        errors: List[str],
        problems: Optional[List[Dict[str, Any]]] = ...,
        exit_code: Optional[int] = ...,
    ) -> None: ...

class SpecError(VramguardError, ValueError): ...

def binary(name: str = ...) -> pathlib.Path: ...
def estimate(
    spec: Spec = ...,
    gpu: Optional[str] = ...,
    gpus: Optional[Sequence[str]] = ...,
    **flags: Any,
) -> Report: ...
def estimate_all(
    spec: Spec = ...,
    gpu: Optional[str] = ...,
    gpus: Optional[Sequence[str]] = ...,
    **flags: Any,
) -> List[Report]: ...
def fit(
    spec: Spec = ...,
    gpu: Optional[str] = ...,
    gpus: Optional[Sequence[str]] = ...,
    **flags: Any,
) -> bool: ...
def max(
    spec: Spec = ...,
    gpu: Optional[str] = ...,
    all_changes: bool = ...,
    **flags: Any,
) -> Report: ...
