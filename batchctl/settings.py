"""batchctl's environment, read by the one settings loader (``functions.core.settings.EnvSettings``).

Every variable is ``BATCHAPI_<FIELD>``; an empty value counts as unset. The one exception is the
key's fallback to ``OPENAI_API_KEY`` (what the openai SDK itself reads). Command-line flags win.
"""

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from functions.core.settings import ENV_PREFIX, EnvSettings
from infra import names


class CliSettings(EnvSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True)

    #: The CloudFormation stack whose outputs name the table and the API (``--stack`` wins).
    stack: str = names.STACK_NAME
    #: The API's base URL for files/batches commands (``--base-url`` wins).
    base_url: str = ""
    #: The API key for files/batches commands (``--api-key`` wins; else OPENAI_API_KEY).
    api_key: str = Field(default="", validation_alias=AliasChoices("BATCHAPI_API_KEY", "OPENAI_API_KEY"))
    #: Where a running ``make up`` keeps its state file (default: <repo>/.local-state).
    local_state_dir: str = ""


#: The variable that names the stack (kept for messages and tests).
STACK_ENV = CliSettings.env_name("stack")
