"""tar, judged only creating or listing archives of the paths it is given: extracting writes the names
the archive holds, and -C, -T, --transform, -P move or rewrite names the policy judged."""

from __future__ import annotations

from collections.abc import Sequence

from ._facts import PathArg, Refused
from ._options import names_option, option_values

__all__ = ["check_tar", "tar_listing"]

#: tar options that extract, change where names resolve, read names from a file, or rewrite them.
_REFUSED = ("-x", "--extract", "--get", "-C", "--directory", "-T", "--files-from", "--transform", "--xform",
            "-P", "--absolute-names", "-K", "--starting-file", "-g", "--listed-incremental")  # fmt: skip
#: Options that make tar write its archive: creating, adding to it, or deleting from it.
_WRITES_ARCHIVE = ("-c", "-r", "-u", "-A", "--create", "--append", "--update", "--catenate", "--concatenate",
                   "--delete")  # fmt: skip


def check_tar(args: Sequence[str]) -> list[str]:
    """Refuse what cannot be judged; the arguments with an old-style first cluster given its dash
    (`tar cf a.tar src` is `tar -cf a.tar src`), before the options that run programs are looked for
    (`tar tIf`)."""
    first = args[0] if args and not args[0].startswith("-") else ""  # old style: `tar xf a.tar`
    for arg in [f"-{first}", *args]:
        for option in _REFUSED:
            if names_option(arg, option):
                raise Refused(f"tar {option} writes or reads names the policy cannot judge")
    spelled = [f"-{first}", *args[1:]] if first else list(args)
    archives = option_values(spelled, {"-f": True, "--file": True})
    # `--force-local` would keep it local, but where it stands it may be a file name or an option's value
    # (`-- --force-local`, `-V --force-local`): a HOST:FILE archive is refused with or without it
    if any(":" in a.text.split("/", 1)[0] for a in archives):
        raise Refused("tar -f HOST:FILE is a remote archive reached through rsh")
    if args and not args[0].startswith("-"):
        return [f"-{args[0]}", *args[1:]]
    return list(args)


def tar_listing(args: Sequence[str]) -> list[PathArg] | None:
    """Listing an archive reads it: the archives `-f` names, as reads. None when tar writes its archive."""
    first = args[0] if args and not args[0].startswith("-") else ""
    if any(names_option(a, o) for a in [f"-{first}", *args] for o in _WRITES_ARCHIVE):
        return None
    return [PathArg(p.text, certain=True) for p in option_values(args, {"-f": True, "--file": True})]
