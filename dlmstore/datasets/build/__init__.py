"""Writing and building datasets, in this process or on Ray.

:mod:`.pretrain` and :mod:`.sft` turn texts and conversations into token
files plus a ``meta.json``; they take an engine (:mod:`.engines`: ``None``
builds here, :class:`~.ray_build.RayEngine` on Ray through :mod:`.ray_build`
and :mod:`.blocks`) rather than importing one. :mod:`.recipes` composes
builders, sources (:mod:`.catalog`, :mod:`.local`) and engines for
``dlm data build``. Below them: the split and budget rules (:mod:`.routing`),
tokenizing (:mod:`.encoding`, :mod:`.chat`), file writers (:mod:`.writers`)
and the output directory, results and progress (:mod:`.output`).
"""
