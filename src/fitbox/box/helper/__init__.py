"""fitbox-helper: a model name that is not weights. A chat naming it is answered here with
guided menus over the box's state and settings (menu.py: the grammar; answers.py: the
reading menus; helper.py: the reply; assist.py: a sentence mapped by ``assist_model``)."""

from __future__ import annotations

from .answers import Caller as Caller
from .answers import ConfigBlocks as ConfigBlocks
from .answers import ConfigTarget as ConfigTarget
from .answers import plain_env_block as plain_env_block
from .helper import Changer as Changer
from .helper import Helper as Helper
from .helper import Reply as Reply
from .menu import HELPER as HELPER
