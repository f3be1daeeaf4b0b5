"""Private implementation of optkit. Import from :mod:`optkit` instead."""
