"""A VLM's processor travels with its tokenizer.

The rest of the package passes a tokenizer around (padding, decoding, saving). A vision-language
policy's tokenizer carries its processor, so the prompts with images, the engine's folder and the
exported model all use, and save, the processor the policy came with (tokenizer, image processor
and chat template together: what ``AutoProcessor.from_pretrained`` reads back).
"""

from __future__ import annotations

_PROCESSOR = "_grpo_processor"


def attach_processor(tokenizer, processor) -> None:
    setattr(tokenizer, _PROCESSOR, processor)


def processor_of(tokenizer):
    """The processor a VLM's tokenizer carries; None for a text model's."""
    return getattr(tokenizer, _PROCESSOR, None)


def saved_with(tokenizer):
    """What to ``save_pretrained`` beside the weights: a VLM's processor, else the tokenizer."""
    return processor_of(tokenizer) or tokenizer


def as_tokenizer(processing_class):
    """A tokenizer, or TRL's ``processing_class`` for a VLM (a processor): its tokenizer, carrying it."""
    if processing_class is not None and hasattr(processing_class, "image_processor"):
        tokenizer = processing_class.tokenizer
        attach_processor(tokenizer, processing_class)
        return tokenizer
    return processing_class
