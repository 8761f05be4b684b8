# The package's public names for type checkers; `__init__.py` imports them lazily.
from seedq.api import Run as Run, evaluate as evaluate, train as train
from seedq.policy import Policy as Policy, load_policy as load_policy

__version__: str
