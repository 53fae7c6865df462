"""vLLM plugin: serve English-only Whisper checkpoints (tiny.en ... medium.en).

vLLM's `WhisperForConditionalGeneration` always prompts the decoder with
`<|startoftranscript|><|LANG|><|TASK|><|notimestamps|>` and, without a `language` field, first
asks the model for a language token. The English-only models were trained without language or
task tokens: given that prompt they answer `<|endoftext|>` at once (an empty transcript), and
the language probe fails (an AssertionError, HTTP 500). This plugin registers the architecture
`WhisperEnglishForConditionalGeneration`: the same model and weights, prompted
`<|startoftranscript|><|notimestamps|>` as OpenAI's own decoder does for `.en` models, language
fixed to English, no language probe. Selected with
`--hf-overrides '{"architectures": ["WhisperEnglishForConditionalGeneration"]}'` (serve.sh), so
the model folder stays a plain Hugging Face Whisper folder.

A translation request gets the English transcript: an English-only model cannot translate, and
English is the only target language of Whisper's translation task anyway.
"""

ARCH = "WhisperEnglishForConditionalGeneration"


def register() -> None:
    """Entry point of the `vllm.general_plugins` group (run in every vLLM process)."""
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, "vllm_whisper_en.model:WhisperEnglishForConditionalGeneration")
