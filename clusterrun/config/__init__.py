"""What the user wrote, read and validated: the inventory (YAML or a hostfile) and SSH's configuration.

Pure: reads files, never connects. Every problem names file:line:col and the key involved.
"""
