#!/usr/bin/env bash
# Create a fresh demo workspace: DIR/workspace (a git worktree on main) pushed to DIR/origin.git.
set -euo pipefail
dir="${1:-.demo}"
rm -rf "$dir/workspace" "$dir/origin.git"
mkdir -p "$dir"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
git init -q --bare -b main "$dir/origin.git"
git init -q -b main "$dir/workspace"
cd "$dir/workspace"
git config user.name "loop-harness demo"
git config user.email "demo@loop-harness.invalid"
git config commit.gpgsign false
printf '# Demo workspace\n\nThe loop-harness demo agent works here.\n' > README.md
printf 'out/\n' > .gitignore   # the inference demo writes here: the tree stays clean between tasks
git add README.md .gitignore
git commit -q -m "initial commit"
git remote add origin ../origin.git
git push -q -u origin main
echo "demo workspace ready: $dir/workspace (origin: $dir/origin.git)"
