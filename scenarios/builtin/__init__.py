"""Built-in scenarios: each a YAML file, plus the Python rules it names when YAML cannot say it.

YAML-only games name a declarative family (``rules: matrix``, ``question`` or ``vote``),
registered by importing :mod:`marl.scenarios.families` here.
"""

import marl.scenarios.families  # noqa: F401 - registers the declarative rule families
