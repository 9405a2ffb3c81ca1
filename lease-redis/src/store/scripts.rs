//! The scripts: every file of `lua/`, each after the rendered limits and `record.lua`.

use std::sync::LazyLock;

use crate::call::Lua;

macro_rules! lua {
    ($file:literal) => {
        concat!(
            include_str!("../../lua/common.lua"),
            include_str!(concat!("../../lua/", $file))
        )
    };
}

/// A hot script, without the common.lua prelude: building its helpers costs each call more
/// than the script's own work saves (see `tests/server_cpu.rs`).
macro_rules! lua_alone {
    ($file:literal) => {
        include_str!(concat!("../../lua/", $file))
    };
}

/// A rebind script: common.lua, then the rebind helper, then the script.
macro_rules! lua_rebind {
    ($file:literal) => {
        concat!(
            include_str!("../../lua/common.lua"),
            include_str!("../../lua/rebind_prelude.lua"),
            include_str!(concat!("../../lua/", $file))
        )
    };
}

/// Every script, built once per process; a call runs EVALSHA and loads it on NOSCRIPT.
pub(crate) struct Scripts {
    pub(crate) create: Lua,
    pub(crate) create_many: Lua,
    pub(crate) claim: Lua,
    pub(crate) claim_next: Lua,
    pub(crate) renew: Lua,
    pub(crate) fenced: Lua,
    pub(crate) end_many: Lua,
    pub(crate) append_keyed: Lua,
    pub(crate) resume: Lua,
    pub(crate) signal: Lua,
    pub(crate) force_release: Lua,
    pub(crate) cancel: Lua,
    pub(crate) inspect: Lua,
    pub(crate) inspect_many: Lua,
    pub(crate) journal: Lua,
    pub(crate) list: Lua,
    pub(crate) purge_due: Lua,
    pub(crate) purge: Lua,
    pub(crate) fold_tombstones: Lua,
    pub(crate) count_purgeable: Lua,
    pub(crate) count: Lua,
    pub(crate) count_kinds: Lua,
    pub(crate) kinds: Lua,
    pub(crate) pause_queue: Lua,
    pub(crate) queues: Lua,
    pub(crate) epoch: Lua,
    pub(crate) epoch_marker: Lua,
    pub(crate) rebind_begin: Lua,
    pub(crate) rebind_page: Lua,
    pub(crate) rebind_end: Lua,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    create: Lua::new(lua!("create.lua")),
    create_many: Lua::new(lua!("create_many.lua")),
    claim: Lua::new(lua_alone!("claim.lua")),
    claim_next: Lua::new(lua!("claim_next.lua")),
    renew: Lua::new(lua_alone!("renew.lua")),
    fenced: Lua::new(lua_alone!("fenced.lua")),
    end_many: Lua::new(lua!("end_many.lua")),
    append_keyed: Lua::new(lua_alone!("append_keyed.lua")),
    resume: Lua::new(lua!("resume.lua")),
    signal: Lua::new(lua!("signal.lua")),
    force_release: Lua::new(lua!("force_release.lua")),
    cancel: Lua::new(lua!("cancel.lua")),
    inspect: Lua::new(lua!("inspect.lua")),
    inspect_many: Lua::new(lua!("inspect_many.lua")),
    journal: Lua::new(lua!("journal.lua")),
    list: Lua::new(lua!("list.lua")),
    purge_due: Lua::new(lua!("purge_due.lua")),
    purge: Lua::new(lua!("purge.lua")),
    fold_tombstones: Lua::new(lua!("fold_tombstones.lua")),
    count_purgeable: Lua::new(lua!("count_purgeable.lua")),
    count: Lua::new(lua!("count.lua")),
    count_kinds: Lua::new(lua!("count_kinds.lua")),
    kinds: Lua::new(lua!("kinds.lua")),
    pause_queue: Lua::new(lua!("pause_queue.lua")),
    queues: Lua::new(lua!("queues.lua")),
    epoch: Lua::new(lua_alone!("epoch.lua")),
    epoch_marker: Lua::new(lua_alone!("epoch_marker.lua")),
    rebind_begin: Lua::new(lua_rebind!("rebind_begin.lua")),
    rebind_page: Lua::new(lua_rebind!("rebind_page.lua")),
    rebind_end: Lua::new(lua_alone!("rebind_end.lua")),
});
