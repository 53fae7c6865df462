"""The English-only Whisper model class (see the package docstring)."""

from __future__ import annotations

from typing import ClassVar

from vllm.inputs import ExplicitEncoderDecoderPrompt, TextPrompt
from vllm.model_executor.models.whisper import WhisperForConditionalGeneration


class WhisperEnglishForConditionalGeneration(WhisperForConditionalGeneration):
    supports_explicit_language_detection = False
    supported_languages: ClassVar[dict[str, str]] = {"en": "English"}

    @classmethod
    def validate_language(cls, language: str | None) -> str | None:
        if language in (None, "en"):
            return "en"
        raise ValueError(f"Unsupported language: {language!r}. This English-only Whisper model supports ['en'].")

    @classmethod
    def get_generation_prompt(cls, stt_params):
        prev = f"<|startofprev|>{stt_params.request_prompt}" if stt_params.request_prompt else ""
        return ExplicitEncoderDecoderPrompt(
            encoder_prompt=TextPrompt(
                prompt="",
                multi_modal_data={"audio": (stt_params.audio, stt_params.stt_config.sample_rate)},
            ),
            decoder_prompt=TextPrompt(prompt=prev + "<|startoftranscript|><|notimestamps|>"),
        )
