/**
 * GPU time where users work: the server's group, GPU, budgets and coming stops in
 * JupyterLab's status bar; JupyterLab notifications once per event; every unsaved
 * document saved shortly before a scheduled stop; and, after a stop, why it
 * stopped and what to do instead of "Server unavailable or unreachable".
 *
 * Everything comes from this server's own server extension
 * (``<base_url>jupyterhub-gpu/status``), which asks the hub's GPU service about
 * this server alone with the server's own token.
 */
import {
  ConnectionLost,
  IConnectionLost,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { ServerConnection, ServiceManager } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import {
  announcedStopWords,
  budgetLowText,
  budgetRow,
  budgetUsedUpText,
  gpuText,
  hubReasonWords,
  idleText,
  noticeItem,
  quotaText,
  runtimeText,
  savedText,
  STALE_NOTE,
  Settings,
  statusLine,
  Stop,
  StatusReply,
  ServiceAnswer,
  STOPPED_TITLE,
  stopItem,
  UNANNOUNCED_TITLE,
  UNANNOUNCED_WORDS,
  unreachableText
} from './messages';

export { statusLine };

const PLUGIN = 'jupyterhub-gpu-jupyterlab:plugin';
const CONNECTION_LOST = 'jupyterhub-gpu-jupyterlab:connection-lost';

/** What the last answers said, shared by the status bar and the connection-lost handler. */
class Model {
  reply: StatusReply | null = null;
  /** the server itself did not answer (stopped, or the network is down) */
  serverGone = false;
  /** when the latest reply came (ms) */
  at = 0;
  /** the stop the last good answer said was next, and whether it was due */
  lastKnownStop: Stop | null = null;
  shownAfterStop = false;
  /** when this page loaded (s): no stop before it can be this run's */
  pageLoaded = Date.now() / 1000;
  changed: (() => void)[] = [];
  emit(): void {
    this.changed.forEach(f => f());
  }
}

const model = new Model();

function el(tag: string, text?: string, cls?: string): HTMLElement {
  const node = document.createElement(tag);
  if (text !== undefined) {
    node.textContent = text;
  }
  if (cls) {
    node.className = cls;
  }
  return node;
}

/** The panel a click on the status bar opens. */
function detailsBody(reply: StatusReply | null): Widget {
  const body = el('div', undefined, 'jp-GPUStatus-details');
  const a = reply?.service;
  if (!reply || !a) {
    body.appendChild(el('p', unreachableText(reply?.error ?? null)));
    return new Widget({ node: body });
  }
  const table = el('table');
  const row = (k: string, v: string) => {
    const tr = el('tr');
    tr.appendChild(el('th', k));
    tr.appendChild(el('td', v));
    table.appendChild(tr);
  };
  row('Group', a.group ? a.group.display_name : 'none');
  row('GPU', gpuText(a));
  if (a.profile) {
    row('Profile', a.profile);
  }
  for (const b of a.budgets) {
    row(...budgetRow(b));
  }
  if (a.quota) {
    row('Group use', quotaText(a.quota));
  }
  if (!a.budgets_current && a.budgets.length) {
    row('Note', STALE_NOTE);
  }
  body.appendChild(table);
  body.appendChild(el('h3', 'Scheduled stops'));
  if (!a.stops.length) {
    body.appendChild(el('p', 'None.'));
  } else {
    const ul = el('ul');
    for (const s of a.stops) {
      ul.appendChild(
        el('li', stopItem(s))
      );
    }
    body.appendChild(ul);
  }
  if (a.notices.length) {
    body.appendChild(el('h3', 'Notices'));
    const ul = el('ul');
    for (const n of a.notices.slice(-5).reverse()) {
      ul.appendChild(el('li', noticeItem(n)));
    }
    body.appendChild(ul);
  }
  const link = el('a', 'Open the GPU usage dashboard') as HTMLAnchorElement;
  link.href = a.dashboard_url;
  link.target = '_blank';
  link.rel = 'noopener';
  body.appendChild(link);
  return new Widget({ node: body });
}

/** The status bar item: one line, a click opens the details. */
class GPUStatusWidget extends Widget {
  constructor() {
    super({ node: el('div', 'GPU: …', 'jp-GPUStatus') });
    this.node.title = 'GPU time: click for details';
    this.node.addEventListener('click', () => {
      void showDialog({
        title: 'GPU time',
        body: detailsBody(model.reply),
        buttons: [Dialog.okButton({ label: 'Close' })]
      });
    });
    model.changed.push(() => this.update());
  }
  protected onUpdateRequest(): void {
    this.node.textContent = statusLine(model.reply, model.serverGone);
    const gone = model.serverGone || !model.reply?.service;
    this.node.classList.toggle('jp-GPUStatus-warn', gone || !!model.reply?.service?.stops.length);
  }
}

/** Notifications shown already, kept per server so a reload does not repeat them. */
class Seen {
  private key: string;
  private keys: Set<string>;
  constructor(server: string) {
    this.key = `jupyterhub-gpu:seen:${server}`;
    let stored: string[] = [];
    try {
      stored = JSON.parse(window.localStorage.getItem(this.key) ?? '[]');
    } catch {
      stored = [];
    }
    this.keys = new Set(stored);
  }
  /** true the first time a key is seen */
  first(key: string): boolean {
    if (this.keys.has(key)) {
      return false;
    }
    this.keys.add(key);
    this.save();
    return true;
  }
  /** forget keys whose condition no longer holds, so a new occurrence tells again */
  keepOnly(prefix: string, live: Set<string>): void {
    for (const k of [...this.keys]) {
      if (k.startsWith(prefix) && !live.has(k)) {
        this.keys.delete(k);
      }
    }
    this.save();
  }
  private save(): void {
    window.localStorage.setItem(this.key, JSON.stringify([...this.keys].slice(-200)));
  }
}

function notify(seen: Seen, a: ServiceAnswer, settings: Settings): void {
  const now = Date.now() / 1000;
  const live = new Set<string>();
  const once = (key: string, show: () => void) => {
    live.add(key);
    if (seen.first(key)) {
      show();
    }
  };
  const budgetStop = a.stops.find(s => s.kind === 'budget');
  for (const b of a.budgets) {
    if (b.exhausted && b.when_exhausted === 'stop' && !budgetStop) {
      // the service has not scheduled the stop yet: told with its time at the next poll
      live.add(`budget-exhausted:${b.owner}:${b.name}`);
    } else if (b.exhausted) {
      once(`budget-exhausted:${b.owner}:${b.name}`, () =>
        Notification.error(budgetUsedUpText(b, budgetStop, now), {
          autoClose: false,
          actions: [{ label: 'Details', callback: () => window.open(a.dashboard_url, '_blank') }]
        })
      );
    } else if (b.used_gpu_hours !== null && b.used_gpu_hours >= settings.budget_low_fraction * b.limit_gpu_hours) {
      once(`budget-low:${b.owner}:${b.name}`, () =>
        Notification.warning(budgetLowText(b), { autoClose: false })
      );
    }
  }
  for (const s of a.stops) {
    if (s.kind === 'idle') {
      once(`idle:${Math.round(s.at)}`, () =>
        Notification.warning(idleText(s, now), { autoClose: false })
      );
    } else if (s.kind === 'max_runtime') {
      // the tightest warning crossed: the settings list them longest first, so the
      // first match would be the 15-minute one again and the 2-minute one never shown
      const crossed = [...settings.runtime_warnings].sort((x, y) => x - y);
      for (const before of crossed) {
        if (s.at - now <= before && s.at > now) {
          once(`runtime:${before}:${Math.round(s.at)}`, () =>
            Notification.warning(runtimeText(s, now), { autoClose: false })
          );
          break;
        }
      }
    }
  }
  if (a.policy_change) {
    const change = a.policy_change;
    once(`policy:${change}`, () => Notification.warning(`${change}.`, { autoClose: false }));
  }
  // a condition that no longer holds (the budget freed, the GPU in use again) is
  // forgotten, so it is told again if it comes back
  seen.keepOnly('budget-', live);
  seen.keepOnly('idle:', live);
  seen.keepOnly('policy:', live);
}

/** Save every open document with unsaved changes; the names of those saved. */
async function saveAll(app: JupyterFrontEnd, docManager: IDocumentManager): Promise<string[]> {
  const saved: string[] = [];
  const done = new Set<string>();
  for (const widget of app.shell.widgets('main')) {
    const context = docManager.contextForWidget(widget);
    if (!context || done.has(context.path) || !context.model.dirty) {
      continue;
    }
    done.add(context.path);
    try {
      await context.save();
      saved.push(context.path);
    } catch (reason) {
      Notification.error(`Could not save ${context.path} before the stop: ${reason}`, { autoClose: false });
    }
  }
  return saved;
}

function afterStopMessage(): { title: string; text: string; what: string } {
  const service = model.reply?.service;
  const last = service?.last_stop;
  const stop = model.lastKnownStop;
  const now = Date.now() / 1000;
  // the last answer came while this server ran: a stop recorded before its start is
  // the previous run's, and says nothing about this one
  if (last && service?.started && last.at >= service.started) {
    return { title: STOPPED_TITLE, text: last.text, what: last.what_to_do };
  }
  if (stop && stop.at <= now + 90) {
    const [text, what] = announcedStopWords(stop);
    return { title: STOPPED_TITLE, text, what };
  }
  const [text, what] = UNANNOUNCED_WORDS;
  return { title: UNANNOUNCED_TITLE, text, what };
}

/** how long the hub's page is asked for the reason of a stop nobody announced (ms) */
const HUB_REASON_WAIT = 30_000;

/**
 * The reason of a stop nobody announced while the server ran (an admin's, a
 * preemption, an eviction), as the hub's home page shows it: the GPU service
 * records every stop, and the hub page reads it. Same origin, with the hub's own
 * login; asked again for a while, as the service records the stop a few seconds
 * after the pod ends. Null when the page has none for this run of the server.
 */
async function reasonFromHub(): Promise<string | null> {
  const server = PageConfig.getOption('hubServerName');
  const started = model.reply?.service?.started ?? model.pageLoaded;
  const deadline = Date.now() + HUB_REASON_WAIT;
  while (Date.now() < deadline) {
    try {
      const response = await fetch(PageConfig.getOption('hubPrefix') + 'home', {
        credentials: 'same-origin'
      });
      if (response.ok) {
        const page = new DOMParser().parseFromString(await response.text(), 'text/html');
        for (const found of Array.from(page.querySelectorAll('.jupyterhub-gpu-last-stop'))) {
          const stop = found as HTMLElement;
          const at = Number(stop.dataset.at);
          if (stop.dataset.server === server && at >= started - 5 && stop.dataset.text) {
            return stop.dataset.text;
          }
        }
      }
    } catch (reason) {
      // the hub itself is unreachable: the generic words below say what is known
      console.warn('GPU: could not read why the server stopped from the hub', reason);
      return null;
    }
    await new Promise(resolve => window.setTimeout(resolve, 3000));
  }
  return null;
}

async function showAfterStop(): Promise<void> {
  if (model.shownAfterStop) {
    return;
  }
  model.shownAfterStop = true;
  let { title, text, what } = afterStopMessage();
  if (title === UNANNOUNCED_TITLE) {
    const reason = await reasonFromHub();
    if (reason) {
      title = STOPPED_TITLE;
      [text, what] = hubReasonWords(reason);
    }
  }
  const hub = model.reply?.service?.hub_url ?? PageConfig.getOption('hubPrefix') + 'home';
  const body = el('div', undefined, 'jp-GPUStatus-stopped');
  body.appendChild(el('p', text));
  body.appendChild(el('p', what));
  const saved = el('p', 'Documents with unsaved changes were saved before the stop.');
  if (savedBeforeStop.length) {
    saved.textContent = `Saved before the stop: ${savedBeforeStop.join(', ')}.`;
    body.appendChild(saved);
  }
  const result = await showDialog({
    title,
    body: new Widget({ node: body }),
    buttons: [Dialog.cancelButton({ label: 'Stay here' }), Dialog.okButton({ label: 'Go to the hub' })]
  });
  if (result.button.accept) {
    window.location.href = hub;
  }
  model.shownAfterStop = false;
}

let savedBeforeStop: string[] = [];

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN,
  description: 'GPU time in the status bar, notifications, and saving before a stop',
  autoStart: true,
  requires: [IStatusBar, IDocumentManager],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar, docManager: IDocumentManager) => {
    const item = new GPUStatusWidget();
    statusBar.registerStatusItem(PLUGIN, { item, align: 'left', rank: 50 });
    const settings = ServerConnection.makeSettings();
    const url = URLExt.join(settings.baseUrl, 'jupyterhub-gpu', 'status');
    const seen = new Seen(`${PageConfig.getOption('hubUser')}/${PageConfig.getOption('hubServerName')}`);
    const savedFor = new Set<number>();
    let interval = 10;

    const poll = async () => {
      let reply: StatusReply | null = null;
      try {
        const response = await ServerConnection.makeRequest(url, {}, settings);
        if (!response.ok) {
          throw new Error(`HTTP ${response.status}`);
        }
        reply = (await response.json()) as StatusReply;
      } catch (reason) {
        // the server itself did not answer: stopped, or unreachable
        model.serverGone = true;
        model.emit();
        if (model.lastKnownStop || model.reply) {
          void showAfterStop();
        }
        return;
      }
      model.serverGone = false;
      model.reply = reply;
      model.at = Date.now();
      const a = reply.service;
      interval = Math.min(Math.max(reply.settings.poll_interval || a?.rule_interval || 10, 1), 30);
      if (a) {
        model.lastKnownStop = a.stops[0] ?? null;
        notify(seen, a, reply.settings);
      }
      model.emit();
    };

    // save before the soonest stop, checked every second against the last answer
    const watchStops = async () => {
      const stop = model.reply?.service?.stops[0];
      if (!stop || model.serverGone) {
        return;
      }
      const left = stop.at - Date.now() / 1000;
      const before = model.reply?.settings.save_before ?? 60;
      if (left <= before && !savedFor.has(stop.at)) {
        savedFor.add(stop.at);
        const saved = await saveAll(app, docManager);
        savedBeforeStop = saved;
        if (saved.length) {
          Notification.info(savedText(saved, stop), { autoClose: false });
        }
      }
    };

    const loop = async () => {
      await poll();
      window.setTimeout(loop, interval * 1000);
    };
    void loop();
    window.setInterval(() => {
      void watchStops();
      item.update(); // the countdown
    }, 1000);
  }
};

/**
 * Instead of JupyterLab's "Server unavailable or unreachable": why this server
 * stopped, if the GPU service said so, and what to do (the hub's own handler is
 * disabled by this package's metadata).
 */
const connectionLost: JupyterFrontEndPlugin<IConnectionLost> = {
  id: CONNECTION_LOST,
  description: 'Says why the server stopped instead of "Server unavailable or unreachable"',
  autoStart: true,
  provides: IConnectionLost,
  activate: (app: JupyterFrontEnd): IConnectionLost => {
    return async (manager: ServiceManager.IManager, err: ServerConnection.NetworkError): Promise<void> => {
      if (model.reply || model.lastKnownStop) {
        model.serverGone = true;
        model.emit();
        return showAfterStop();
      }
      return ConnectionLost(manager, err);
    };
  }
};

export default [plugin, connectionLost];
