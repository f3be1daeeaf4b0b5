"""Adafactor (Shazeer & Stern 2018; SPEC.md section 5), by concern.

- :mod:`~optkit._src.adafactor.paper`: the algorithm for one tensor, as the paper writes it;
- :mod:`~optkit._src.adafactor.fast`: the same step in fewer passes (what runs);
- :mod:`~optkit._src.adafactor.factoring`: which axes a parameter is factored over;
- :mod:`~optkit._src.adafactor.rules`: factor rules (rows, columns, batch axes) by path or logical name;
- :mod:`~optkit._src.adafactor.state`: the statistics' types, made at ``init``;
- :mod:`~optkit._src.adafactor.reading`: statistics read back from Flax and Orbax containers;
- :mod:`~optkit._src.adafactor.engine`: one transformation's init and update, factored as a planner says;
- :mod:`~optkit._src.adafactor.transform`: the paper's planner, the Optax transformations and the alias;
- :mod:`~optkit._src.adafactor.t5x`: T5X's planner and Adafactor, its arguments onto the same engine.
"""

from optkit._src.adafactor.factoring import factored_axes
from optkit._src.adafactor.rules import t5x_standard_logical_factor_rules
from optkit._src.adafactor.state import (
    FactoredSecondMoment,
    FullSecondMoment,
    ScaleByAdafactorState,
    ScaleByFactoredRmsState,
)
from optkit._src.adafactor.t5x import t5x_adafactor
from optkit._src.adafactor.transform import adafactor, scale_by_adafactor, scale_by_factored_rms

__all__ = [
    "FactoredSecondMoment",
    "FullSecondMoment",
    "ScaleByAdafactorState",
    "ScaleByFactoredRmsState",
    "adafactor",
    "factored_axes",
    "scale_by_adafactor",
    "scale_by_factored_rms",
    "t5x_adafactor",
    "t5x_standard_logical_factor_rules",
]
