"""Names `vulture seedq vulture_whitelist.py` would call unused, each with what
calls or reads it (tests/test_imports.py runs vulture; seedq/v1/, protoc's
output, is excluded in pyproject.toml's [tool.vulture])."""

# ruff: noqa

__getattr__  # Python's attribute lookup on the module `seedq` (PEP 562): `seedq.train` and the rest of the API
__dir__  # dir(seedq) and tab completion (PEP 562)
learner_state  # the Agent protocol's parameter (seedq/agents/base.py), which the learner passes by position
_.exit_on_error  # argparse.ArgumentParser.parse_known_args reads it (seedq/api.py sets it)
_.intercept_service  # grpc.aio calls a server interceptor's intercept_service on every call (seedq/transport/channel.py)
request_iterator  # grpc.aio passes a stream handler its requests by position, read or not
namespace  # argparse calls an Action as action(parser, namespace, values, option_string)
option_string  # (the same call)
_.ignore_aliases  # yaml.SafeDumper calls it for every node it represents (seedq/launch/k8s.py)
tb  # Python calls an async context manager's __aexit__(type, value, traceback) (seedq/server/service.py)
