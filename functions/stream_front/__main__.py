"""``python -m functions.stream_front``: the streaming front as the stack runs it (a Fargate task
behind the distribution's load balancer), configured as the Lambdas are (``Settings`` from the
environment) plus ``STREAM_FRONT_API_ORIGIN``, the API that answers the requests on its paths that
it does not stream."""

import os
import signal
import threading

from functions.core import deps

from .routes import StreamFront
from .server import PORT, make_server

#: The API's origin, ``https://<rest-api-host>/<stage>`` (the distribution's default origin).
API_ORIGIN_ENV = "STREAM_FRONT_API_ORIGIN"


def main() -> None:
    front = StreamFront(deps.stores, deps.settings(), deps.now)
    server = make_server(front, os.environ[API_ORIGIN_ENV], port=PORT)
    # ECS stops a task with SIGTERM: stop taking connections (the load balancer has deregistered
    # the task and waited out its delay by then) and let the requests in flight end.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
