//! `lockstep audit NODE --html` and `lockstep timeline --html`: one
//! self-contained HTML file per question, to look at and to send around.
//!
//! Per Slurm node, a timeline: its phases as coloured bands, the events
//! about it as ticks, its actions as arrows from issue to outcome; hovering
//! shows what each is, clicking a band marks the event that caused it and
//! its line in the textual chain below. Everything is inline (CSS, the
//! data as JSON, the script that draws the SVG): the file opens from disk
//! with no network.
//!
//! This module renders what a replay found; it never decides anything and
//! never reads a log itself.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use lockstep_engine::replay::{Audit, AuditEntry, Replay};
use lockstep_engine::Engine;
use lockstep_schemas::log::DecodeError;
use lockstep_schemas::{Event, Policy, Record};
use serde::Serialize;

use crate::render;

/// Slurm nodes one page shows, at most (a timeline of a whole cluster is
/// asked for with `--nodes` or a range).
pub const NODES_MAX: usize = 200;

/// Which part of the log a page covers.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// The Slurm nodes; empty: every node with a transition in range.
    pub nodes: Vec<String>,
    /// First sequence shown.
    pub from_seq: Option<u64>,
    /// Last sequence shown.
    pub to_seq: Option<u64>,
}

impl Scope {
    fn contains(&self, seq: u64) -> bool {
        self.from_seq.is_none_or(|f| seq >= f) && self.to_seq.is_none_or(|t| seq <= t)
    }
}

/// What the page draws for one node.
#[derive(Debug, Serialize)]
pub struct NodeData {
    /// Slurm node.
    pub name: String,
    /// Phase bands, from each transition to the next.
    pub bands: Vec<Band>,
    /// Events about the node, its pod or its Kubernetes node.
    pub events: Vec<Tick>,
    /// Actions on them, with their outcomes.
    pub actions: Vec<Arrow>,
}

/// A phase from one transition to the next.
#[derive(Debug, Serialize)]
pub struct Band {
    /// Sequence of the transition.
    pub seq: u64,
    /// From (ms).
    pub from_ms: u64,
    /// To (ms): the next transition, or the end of the page.
    pub to_ms: u64,
    /// The phase.
    pub phase: &'static str,
    /// The phase before.
    pub from_phase: &'static str,
    /// The rule.
    pub rule: &'static str,
    /// Why.
    pub detail: String,
    /// The causing event's sequence, when it is on the page.
    pub cause_seq: Option<u64>,
    /// The causing event's summary (or id).
    pub cause: String,
}

/// An event.
#[derive(Debug, Serialize)]
pub struct Tick {
    /// Sequence.
    pub seq: u64,
    /// Log time (ms).
    pub time_ms: u64,
    /// Summary.
    pub summary: String,
}

/// An action and its outcome.
#[derive(Debug, Serialize)]
pub struct Arrow {
    /// Issued by the record at this sequence.
    pub seq: u64,
    /// Issued at (ms).
    pub time_ms: u64,
    /// Action id.
    pub id: String,
    /// Kind.
    pub kind: &'static str,
    /// What it does.
    pub what: String,
    /// Rule.
    pub rule: String,
    /// Attempt.
    pub attempt: u32,
    /// The outcome, once the log has it.
    pub outcome: Option<OutcomeMark>,
}

/// Where and how an action ended.
#[derive(Debug, Serialize)]
pub struct OutcomeMark {
    /// Sequence of the outcome event.
    pub seq: u64,
    /// Log time (ms).
    pub time_ms: u64,
    /// `succeeded`, `already_done`, `failed_retryable`, `failed`.
    pub result: &'static str,
}

/// Everything a page shows.
#[derive(Debug, Serialize)]
pub struct Page {
    /// Heading.
    pub title: String,
    /// Start of the time axis (ms).
    pub t0_ms: u64,
    /// End of the time axis (ms).
    pub t1_ms: u64,
    /// Per node.
    pub nodes: Vec<NodeData>,
    /// The textual chain per node (the `lockstep audit` text).
    #[serde(skip)]
    pub chains: Vec<(String, String)>,
}

/// The Slurm nodes with a transition in the scope's range, at most
/// [`NODES_MAX`] (by name): the nodes of a timeline when none are named. A
/// first pass over the log, so that the second sees each node's events
/// from the start.
pub fn nodes_in(
    records: impl Iterator<Item = Result<Record, DecodeError>>,
    scope: &Scope,
) -> Vec<String> {
    let mut replay = Replay::new(Engine::new(Policy::default()));
    let mut nodes = std::collections::BTreeSet::new();
    for rec in records {
        let Ok(rec) = rec else { break };
        match replay.feed(&rec) {
            Ok(lockstep_engine::replay::Step::Applied(_, out)) => {
                for t in &out.transitions {
                    if scope.contains(t.seq) {
                        nodes.insert(t.node.clone());
                    }
                }
            }
            Ok(_) => {}
            // `collect` reports it.
            Err(_) => break,
        }
    }
    nodes.into_iter().take(NODES_MAX).collect()
}

/// Replays a log and gathers what the page shows for the scope's nodes
/// (see [`nodes_in`] when none are named); with the damage, if the log is
/// damaged (the page covers it up to there).
pub fn collect(
    records: impl Iterator<Item = Result<Record, DecodeError>>,
    scope: &Scope,
    title: String,
) -> (Page, Option<crate::commands::Damage>) {
    let mut replay = Replay::new(Engine::new(Policy::default()));
    let mut audits: BTreeMap<String, Audit> = scope
        .nodes
        .iter()
        .map(|n| (n.clone(), Audit::new(n.clone())))
        .collect();
    let mut outcomes: HashMap<String, OutcomeMark> = HashMap::new();
    let (mut t0, mut t1) = (u64::MAX, 0u64);
    let mut damage = None;
    for rec in records {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                damage = Some(e.into());
                break;
            }
        };
        if let Err(e) = replay.feed(&rec) {
            damage = Some(e.into());
            break;
        }
        let Record::Event(ev) = &rec else { continue };
        if scope.contains(ev.seq) {
            t0 = t0.min(ev.time_ms);
            t1 = t1.max(ev.time_ms);
        }
        if let Event::ActionOutcome(o) = &ev.envelope.event {
            outcomes.insert(
                o.action_id.0.clone(),
                OutcomeMark {
                    seq: ev.seq,
                    time_ms: ev.time_ms,
                    result: crate::telemetry::outcome_result(&o.result),
                },
            );
        }
        for a in audits.values_mut() {
            a.observe(ev, replay.output(), replay.engine());
        }
    }
    if t0 > t1 {
        (t0, t1) = (0, 0);
    }
    let mut page = Page {
        title,
        t0_ms: t0,
        t1_ms: t1.max(t0 + 1),
        nodes: Vec::new(),
        chains: Vec::new(),
    };
    for (name, audit) in audits {
        let entries: Vec<&AuditEntry> = audit
            .entries()
            .iter()
            .filter(|e| scope.contains(entry_seq(e)))
            .collect();
        page.nodes
            .push(node_data(&name, &entries, &outcomes, page.t1_ms));
        let owned: Vec<AuditEntry> = entries.into_iter().cloned().collect();
        page.chains
            .push((name.clone(), render::audit(&name, &owned)));
    }
    (page, damage)
}

fn entry_seq(e: &AuditEntry) -> u64 {
    match e {
        AuditEntry::Event { seq, .. } => *seq,
        AuditEntry::Transition(t) => t.seq,
        AuditEntry::Action(a) => a.seq,
    }
}

fn node_data(
    name: &str,
    entries: &[&AuditEntry],
    outcomes: &HashMap<String, OutcomeMark>,
    end_ms: u64,
) -> NodeData {
    let mut events: HashMap<&str, (u64, &str)> = HashMap::new();
    let mut node = NodeData {
        name: name.to_owned(),
        bands: Vec::new(),
        events: Vec::new(),
        actions: Vec::new(),
    };
    for e in entries {
        match e {
            AuditEntry::Event {
                seq,
                time_ms,
                id,
                summary,
            } => {
                events.insert(id.0.as_str(), (*seq, summary.as_str()));
                node.events.push(Tick {
                    seq: *seq,
                    time_ms: *time_ms,
                    summary: summary.clone(),
                });
            }
            AuditEntry::Transition(t) => {
                if let Some(prev) = node.bands.last_mut() {
                    prev.to_ms = t.time_ms;
                }
                let (cause_seq, cause) = match events.get(t.cause.0.as_str()) {
                    Some((seq, summary)) => (Some(*seq), format!("seq {seq}: {summary}")),
                    None => (None, format!("event {}", t.cause)),
                };
                node.bands.push(Band {
                    seq: t.seq,
                    from_ms: t.time_ms,
                    to_ms: end_ms,
                    phase: t.to.name(),
                    from_phase: t.from.name(),
                    rule: t.rule.name(),
                    detail: t.detail.clone(),
                    cause_seq,
                    cause,
                });
            }
            AuditEntry::Action(a) => node.actions.push(Arrow {
                seq: a.seq,
                time_ms: a.time_ms,
                id: a.id.0.clone(),
                kind: a.action.kind().name(),
                what: a.action.describe(),
                rule: a.rule.clone(),
                attempt: a.attempt,
                outcome: outcomes.get(&a.id.0).map(|o| OutcomeMark {
                    seq: o.seq,
                    time_ms: o.time_ms,
                    result: o.result,
                }),
            }),
        }
    }
    node
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page, as one HTML document.
pub fn render(page: &Page) -> String {
    // JSON inside <script>: `</` must not close the element.
    let data = serde_json::to_string(page)
        .expect("the page is JSON")
        .replace("</", "<\\/");
    let mut chains = String::new();
    for (name, text) in &page.chains {
        let mut rows = String::new();
        for line in text.lines() {
            // `... seq 18     transition ...`: the row's anchor.
            let seq = line
                .split("  seq ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok());
            let _ = match seq {
                Some(seq) => writeln!(
                    rows,
                    "<div class=\"row\" data-seq=\"{seq}\">{}</div>",
                    escape(line)
                ),
                None => writeln!(rows, "<div class=\"row\">{}</div>", escape(line)),
            };
        }
        let _ = writeln!(
            chains,
            "<section class=\"chain\" data-node=\"{n}\"><h3>Causal chain of {n}</h3><div class=\"text\">{rows}</div></section>",
            n = escape(name)
        );
    }
    TEMPLATE
        .replace("{{title}}", &escape(&page.title))
        .replace(
            "{{range}}",
            &escape(&format!(
                "{} .. {}",
                render::time(page.t0_ms),
                render::time(page.t1_ms)
            )),
        )
        .replace("{{chains}}", &chains)
        .replace("{{data}}", &data)
}

const TEMPLATE: &str = r##"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{title}}</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:18px 0 4px} h3{font-size:14px;margin:14px 0 4px}
.sub{color:#5a6170;margin-bottom:12px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border-radius:2px}
.node{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 12px;margin:10px 0}
.node h2{margin:2px 0 6px}
svg{display:block;width:100%;height:auto;overflow:visible}
.band{stroke:#fff;stroke-width:1;cursor:pointer}
.band.selected{stroke:#111;stroke-width:2}
.tick{stroke:#3d4654;stroke-width:1.5}
.tick.cause{stroke:#d81b60;stroke-width:4}
.arrow{fill:none;stroke-width:2}
.arrow.succeeded,.arrow.already_done{stroke:#2e7d32} .arrow.failed,.arrow.failed_retryable{stroke:#c62828}
.arrow.pending{stroke:#9e9e9e;stroke-dasharray:4 3}
.axis{fill:#5a6170;font-size:11px} .grid{stroke:#e6e9ee}
.lane{fill:#5a6170;font-size:11px}
.chain .text{font:12px/1.45 "DejaVu Sans Mono",monospace;overflow-x:auto;background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px}
.row{white-space:pre}
.row.hit{background:#fde2ec}
#info{position:sticky;top:0;background:#fff8e1;border:1px solid #f0d98c;border-radius:6px;padding:6px 10px;min-height:20px;font-size:13px;z-index:1}
</style></head><body>
<h1>{{title}}</h1>
<div class="sub">log time {{range}} &middot; hover for details, click a phase band to mark the event that caused it</div>
<div class="legend" id="legend"></div>
<div id="info">&nbsp;</div>
<div id="timelines"></div>
{{chains}}
<script id="data" type="application/json">{{data}}</script>
<script>
(function(){
"use strict";
var page=JSON.parse(document.getElementById("data").textContent);
var COLORS={unknown:"#b0b7c3",in_service:"#43a047",draining:"#fb8c00",drained:"#e53935",resuming:"#29b6f6",foreign_drain:"#8e24aa",slurm_unhealthy:"#6d4c41"};
var NS="http://www.w3.org/2000/svg", W=1100, L=90, R=16, info=document.getElementById("info");
var legend=document.getElementById("legend");
Object.keys(COLORS).forEach(function(p){var s=document.createElement("span");s.innerHTML='<i style="background:'+COLORS[p]+'"></i>'+p.replace("_"," ");legend.appendChild(s);});
var span=Math.max(1,page.t1_ms-page.t0_ms);
function x(t){return L+(W-L-R)*(t-page.t0_ms)/span;}
function el(name,attrs,parent,title){var e=document.createElementNS(NS,name);for(var k in attrs)e.setAttribute(k,attrs[k]);if(title){var t=document.createElementNS(NS,"title");t.textContent=title;e.appendChild(t);}parent.appendChild(e);return e;}
function iso(ms){return new Date(ms).toISOString();}
function show(text){info.textContent=text;}
function mark(node,seq){
  document.querySelectorAll(".tick.cause,.band.selected,.row.hit").forEach(function(e){e.classList.remove("cause","selected","hit");});
  if(seq===null||seq===undefined)return;
  document.querySelectorAll('.tick[data-node="'+CSS.escape(node)+'"][data-seq="'+seq+'"]').forEach(function(e){e.classList.add("cause");});
  var sec=document.querySelector('.chain[data-node="'+CSS.escape(node)+'"]');
  if(sec){var rows=sec.querySelectorAll('.row[data-seq="'+seq+'"]');rows.forEach(function(r){r.classList.add("hit");});if(rows.length)rows[0].scrollIntoView({block:"nearest"});}
}
var root=document.getElementById("timelines");
page.nodes.forEach(function(n){
  var box=document.createElement("div");box.className="node";box.setAttribute("data-node",n.name);
  var h=document.createElement("h2");h.textContent=n.name;box.appendChild(h);
  var svg=el("svg",{viewBox:"0 0 "+W+" 112",preserveAspectRatio:"xMinYMin meet","data-node":n.name},box);
  for(var i=0;i<=4;i++){var t=page.t0_ms+span*i/4,gx=x(t);el("line",{x1:gx,x2:gx,y1:14,y2:108,"class":"grid"},svg);
    el("text",{x:gx,y:10,"class":"axis","text-anchor":i===0?"start":(i===4?"end":"middle")},svg).textContent=iso(t).slice(11,23);}
  el("text",{x:0,y:38,"class":"lane"},svg).textContent="phase";
  el("text",{x:0,y:66,"class":"lane"},svg).textContent="events";
  el("text",{x:0,y:94,"class":"lane"},svg).textContent="actions";
  n.bands.forEach(function(b){
    var x0=x(b.from_ms),x1=Math.max(x(b.to_ms),x0+3);
    var tip=b.from_phase+" \u2192 "+b.phase+" ["+b.rule+"] "+b.detail+" (seq "+b.seq+", "+iso(b.from_ms)+"); because of "+b.cause;
    var r=el("rect",{x:x0,y:22,width:x1-x0,height:24,fill:COLORS[b.phase]||"#999","class":"band","data-phase":b.phase,"data-seq":b.seq,"data-node":n.name},svg,tip);
    r.addEventListener("mouseenter",function(){show(tip);});
    r.addEventListener("click",function(){mark(n.name,b.cause_seq);r.classList.add("selected");show(tip);});
  });
  n.events.forEach(function(e){
    var ex=x(e.time_ms),tip="seq "+e.seq+" "+iso(e.time_ms)+": "+e.summary;
    var t=el("line",{x1:ex,x2:ex,y1:54,y2:72,"class":"tick","data-seq":e.seq,"data-node":n.name},svg,tip);
    t.addEventListener("mouseenter",function(){show(tip);});
    t.addEventListener("click",function(){mark(n.name,e.seq);show(tip);});
  });
  n.actions.forEach(function(a,i){
    var ax=x(a.time_ms),end=a.outcome?x(a.outcome.time_ms):(W-R),y=84+(i%3)*7;
    var cls="arrow "+(a.outcome?a.outcome.result:"pending");
    var tip=a.id+(a.attempt>1?" (attempt "+a.attempt+")":"")+" ["+a.rule+"]: "+a.what+" \u2192 "+(a.outcome?a.outcome.result+" at seq "+a.outcome.seq:"no outcome in this log");
    var p=el("path",{d:"M"+ax+","+y+" L"+Math.max(end,ax+6)+","+y,"class":cls,"marker-end":"url(#head)","data-seq":a.seq,"data-node":n.name,"data-kind":a.kind},svg,tip);
    el("circle",{cx:ax,cy:y,r:2.5,fill:"#3d4654"},svg);
    p.addEventListener("mouseenter",function(){show(tip);});
    p.addEventListener("click",function(){mark(n.name,a.seq);show(tip);});
  });
  var defs=el("defs",{},svg),m=el("marker",{id:"head",viewBox:"0 0 6 6",refX:5,refY:3,markerWidth:6,markerHeight:6,orient:"auto"},defs);
  el("path",{d:"M0,0 L6,3 L0,6 z",fill:"#3d4654"},m);
  root.appendChild(box);
});
if(!page.nodes.length){root.textContent="No Slurm node in this part of the log.";}
document.body.setAttribute("data-drawn","true");
})();
</script>
</body></html>
"##;
