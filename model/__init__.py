"""BiGS model definitions (torch and Flax), the SSM math, weight conversion and the tokenizer.

Importing `model` registers BiGS with the transformers Auto classes, so
`AutoModelForMaskedLM.from_pretrained(dir)` and `transformers.pipeline(..., model=dir)` work on an
artifact dir. The torch parts need the `torch` extra; the Flax parts (`model.modeling_flax_bigs`)
need the `train` extra and are imported on demand.
"""

from .configuration_bigs import BiGSConfig

__all__ = ["BiGSConfig"]

try:
    import torch  # noqa: F401
except ImportError:  # a serving-only install: configs and tokenizer only
    pass
else:
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
    )

    from .modeling_bigs import BiGSForMaskedLM, BiGSForSequenceClassification, BiGSModel

    AutoConfig.register(BiGSConfig.model_type, BiGSConfig, exist_ok=True)
    AutoModel.register(BiGSConfig, BiGSModel, exist_ok=True)
    AutoModelForMaskedLM.register(BiGSConfig, BiGSForMaskedLM, exist_ok=True)
    AutoModelForSequenceClassification.register(BiGSConfig, BiGSForSequenceClassification, exist_ok=True)
    __all__ += ["BiGSModel", "BiGSForMaskedLM", "BiGSForSequenceClassification"]
