"""The only code that runs SQL: table metadata, named statements, repository, migrations."""
