"""batchctl: the operator and user CLI of a deployment (``.venv/bin/batchctl``, ``python -m batchctl``).

    batchctl keys create --tenant NAME     prints a new key for NAME (its id on stderr)
    batchctl keys list --tenant NAME       NAME's keys: id, hint, created_at, status (never the key)
    batchctl keys revoke KEY | --id ID     revokes a key
    batchctl keys backfill                 ids and listings for keys stored before key ids (once)
    batchctl webhooks create|list|rotate|delete|deliveries --tenant NAME ...   (docs/webhooks.md)
    batchctl tenants create|get|set|list [--tenant NAME ...]   tenant policies (docs/governance.md)
    batchctl tenants disable|enable NAME   refuse (accept again) every key of NAME
    batchctl files upload PATH             uploads a file (large ones through the Uploads API)
    batchctl batches create|get|list|cancel|wait|retry|download ...   (see batchctl/batches.py)
    batchctl run-batch -i IN -o OUT [--errors ERR] --engine-url URL | --model NAME [-- ENGINE_ARGS]
                                           runs a local batch file through an engine (no AWS);
                                           --model starts it for the run (docs/run-batch.md)

Modules: ``cli`` (the parser and ``main``), ``settings`` (its environment, ``CliSettings``),
``targets`` (which deployment: the local one or a stack), ``keys`` (API keys, straight in the
table), ``batches`` (files and batches through the official openai SDK).

Dependencies, decided: batchctl imports ``functions`` (key hashing, the key repository, limits,
statuses, the settings loader) and ``gpu_worker`` (``run-batch`` is the worker's offline mode). To
find a deployment it imports two small ``infra`` modules, ``infra.names`` (the stack name and its
outputs, the local key) and ``infra.local.state`` (the running ``make up``'s state file), the same
modules that write those names, rather than copies of them; neither pulls in CDK or moto. Nothing
under ``functions`` or ``gpu_worker`` imports batchctl (``tests/unit/test_imports.py``).
"""

from .cli import main

__all__ = ["main"]
