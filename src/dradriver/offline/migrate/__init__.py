"""Moving from NVIDIA's DRA driver or its device plugin (with GPU Feature Discovery) to dradriver.

Pure translation, no I/O; `dradriver migrate` (cli/migrate.py) reads and writes the files.

    from dradriver.offline.migrate import migrate
    for migration in migrate(objects, driver="gpu.dradriver.dev"):
        migration.outputs, migration.changes, migration.problems
"""

from dradriver.offline.migrate.translate import Change, Migration, Problem, describe, migrate

__all__ = ["Change", "Migration", "Problem", "describe", "migrate"]
