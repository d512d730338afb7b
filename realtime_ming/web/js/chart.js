/**
 * A small canvas bar chart of per-turn time to first audio (TTFA), newest on the right, with a
 * dashed median line. Colours come from CSS custom properties, so it follows the page theme.
 */

const GOOD_MS = 500;
const FAIR_MS = 1000;

function niceCeil(value) {
  const steps = [200, 300, 500, 800, 1000, 1500, 2000, 3000, 5000, 8000, 10000, 20000, 30000, 60000];
  return steps.find((s) => s >= value) ?? Math.ceil(value / 10000) * 10000;
}

export function median(values) {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

export class LatencyChart {
  constructor(canvas, { maxBars = 20 } = {}) {
    this.canvas = canvas;
    this.maxBars = maxBars;
    this.values = [];
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  push(ms) {
    this.values.push(ms);
    if (this.values.length > this.maxBars) this.values.shift();
    this.draw();
  }

  clear() {
    this.values = [];
    this.draw();
  }

  draw() {
    const { canvas, values } = this;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (width === 0 || height === 0) return;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, height);
    const css = getComputedStyle(canvas);
    const color = (name) => css.getPropertyValue(name).trim();
    g.font = `11px ${css.fontFamily}`;
    g.textBaseline = "middle";

    if (values.length === 0) {
      g.fillStyle = color("--text-faint");
      g.textAlign = "center";
      g.fillText("Latency per turn appears here", width / 2, height / 2);
      return;
    }
    const left = 50;
    const top = 8;
    const bottom = height - 6;
    const plotWidth = width - left - 4;
    const yMax = niceCeil(Math.max(...values) * 1.1);
    const y = (ms) => bottom - ((bottom - top) * ms) / yMax;

    g.strokeStyle = color("--grid");
    g.fillStyle = color("--text-faint");
    g.textAlign = "right";
    g.lineWidth = 1;
    for (const ms of [0, yMax / 2, yMax]) {
      const yy = Math.round(y(ms)) + 0.5;
      g.beginPath();
      g.moveTo(left, yy);
      g.lineTo(width - 4, yy);
      g.stroke();
      g.fillText(ms >= 1000 ? `${(ms / 1000).toFixed(ms % 1000 ? 1 : 0)} s` : `${ms} ms`, left - 6, yy);
    }

    const slot = plotWidth / this.maxBars;
    const barWidth = Math.max(3, slot * 0.62);
    values.forEach((ms, i) => {
      const x = left + slot * (this.maxBars - values.length + i) + (slot - barWidth) / 2;
      const yy = y(ms);
      g.fillStyle = color(ms < GOOD_MS ? "--good" : ms < FAIR_MS ? "--fair" : "--bad");
      g.globalAlpha = i === values.length - 1 ? 1 : 0.55;
      g.beginPath();
      g.roundRect(x, yy, barWidth, bottom - yy, [3, 3, 0, 0]);
      g.fill();
    });
    g.globalAlpha = 1;

    const med = median(values);
    const ym = Math.round(y(med)) + 0.5;
    g.strokeStyle = color("--accent");
    g.setLineDash([4, 4]);
    g.beginPath();
    g.moveTo(left, ym);
    g.lineTo(width - 4, ym);
    g.stroke();
    g.setLineDash([]);
  }
}
