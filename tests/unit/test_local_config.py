"""The local deployment's models (``python -m infra.local``'s configuration): one engine per model
its API routes, the speech model among them unless ``BATCHAPI_LOCAL_SPEECH=0``."""

from functions.core.limits import AUDIO_ENDPOINTS
from infra import names
from infra.local.__main__ import SPEECH_ENV, config_from_env


def engines_and_routes(env):
    config = config_from_env(env)
    return [model for model, _ in config.engine_ports], sorted(config.settings.models)


def test_make_up_serves_chat_embeddings_and_speech_each_with_its_engine():
    engines, routed = engines_and_routes({})
    assert (
        sorted(engines) == routed == sorted([names.LOCAL_CHAT_MODEL, names.LOCAL_EMBED_MODEL, names.LOCAL_SPEECH_MODEL])
    )
    speech = config_from_env({}).settings.models[names.LOCAL_SPEECH_MODEL]
    assert speech.endpoints == AUDIO_ENDPOINTS
    served = config_from_env({}).settings.served_endpoints()
    assert set(AUDIO_ENDPOINTS) <= set(served)


def test_without_speech_neither_its_route_nor_its_engine():
    engines, routed = engines_and_routes({SPEECH_ENV: "0"})
    assert sorted(engines) == routed == sorted([names.LOCAL_CHAT_MODEL, names.LOCAL_EMBED_MODEL])
    served = config_from_env({SPEECH_ENV: "0"}).settings.served_endpoints()
    assert not set(AUDIO_ENDPOINTS) & set(served)
    assert engines_and_routes({SPEECH_ENV: "1"}) == engines_and_routes({})
