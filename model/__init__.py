"""BiGS model definitions (torch and Flax), the SSM math, weight conversion and the tokenizer.

Importing `model` registers BiGS with the transformers Auto classes, so
`AutoModelForMaskedLM.from_pretrained(dir)` and `transformers.pipeline(..., model=dir)` work on an
artifact dir. Without the project, the dir loads with `trust_remote_code=True`: it carries the model
code and `auto_map` (model/hub.py). The torch parts need the `torch` extra; the Flax parts (`model.modeling_flax_bigs`)
need the `train` extra and are imported on demand.
"""

from .configuration_bigs import BiGSConfig

__all__ = ["BiGSConfig"]

try:
    import torch  # noqa: F401
except ImportError:  # a serving-only install: configs and tokenizer only
    pass
else:
    import transformers

    from . import modeling_bigs
    from .hub import AUTO_MAP
    from .modeling_bigs import (
        BiGSForMaskedLM,
        BiGSForQuestionAnswering,
        BiGSForSequenceClassification,
        BiGSForTokenClassification,
        BiGSModel,
    )

    # The same classes that a saved dir's auto_map names (model/hub.py).
    transformers.AutoConfig.register(BiGSConfig.model_type, BiGSConfig, exist_ok=True)
    for auto_class, reference in AUTO_MAP.items():
        module, name = reference.split(".")
        if module == "modeling_bigs":
            getattr(transformers, auto_class).register(BiGSConfig, getattr(modeling_bigs, name), exist_ok=True)
    __all__ += [
        "BiGSModel",
        "BiGSForMaskedLM",
        "BiGSForSequenceClassification",
        "BiGSForQuestionAnswering",
        "BiGSForTokenClassification",
    ]
