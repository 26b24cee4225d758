"""What every job-file section is made of: the strict base model and the shared field types.

Kept apart from `rlctl.job.spec` so that an algorithm's own spec module (`rlctl/algos/<name>/spec.py`) can build on it
while `rlctl.job.spec` assembles the algorithm sections from the registry.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """Base of every job-file section: strict types, no unknown keys, no NaN/inf."""

    # ser_json_inf_nan: free-form values (env and wrapper kwargs) may hold inf or nan, which TOML writes; dumped as
    # null, a job written back (job.toml, what remote hosts run) lost them or could not be written at all.
    model_config = ConfigDict(
        extra="forbid", strict=True, allow_inf_nan=False, use_attribute_docstrings=True, frozen=True,
        ser_json_inf_nan="constants",
    )


PosInt = Annotated[int, Field(ge=1, le=1 << 40)]
NonNegInt = Annotated[int, Field(ge=0, le=1 << 40)]
PosFloat = Annotated[float, Field(gt=0, le=1e12)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Coef = Annotated[float, Field(ge=0, le=1e6)]
Discount = Annotated[float, Field(gt=0, le=1)]
LearningRate = Annotated[float, Field(gt=0, le=1)]
