"""The jitter-buffer worklet on its own, in Chromium: prebuffer, underruns, waiting, clear."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Runs in the page: a second AudioContext with its own worklet node, driven message by message.
# waitFor resolves on the worklet's own stats messages, so nothing here sleeps.
SCRIPT = """async () => {
  const ctx = new AudioContext({ sampleRate: 24000 });
  await ctx.audioWorklet.addModule('/player-worklet.js');
  const node = new AudioWorkletNode(ctx, 'voxgate-player', { numberOfInputs: 0, outputChannelCount: [1] });
  node.connect(ctx.destination);
  let last = null;
  const waiters = [];
  node.port.onmessage = (e) => {
    last = e.data;
    for (const w of [...waiters]) if (w.pred(last)) { waiters.splice(waiters.indexOf(w), 1); w.resolve({ ...last }); }
  };
  const waitFor = (pred) => new Promise((resolve, reject) => {
    waiters.push({ pred, resolve });
    // A guard so that a broken worklet fails the test with its state instead of hanging it.
    setTimeout(() => reject(new Error(`stuck; last stats ${JSON.stringify(last)}`)), 20000);
  });
  const send = (msg) => node.port.postMessage(msg);
  const tone = (n) => Float32Array.from({ length: n }, (_, i) => 0.2 * Math.sin(i / 5));
  const out = {};

  send({ type: 'config', prebuffer: 4800 });
  send({ type: 'expect', value: true });
  send({ type: 'push', samples: tone(2400) });
  // Below the prebuffer: it holds the audio and plays nothing.
  out.held = await waitFor((s) => s.buffered === 2400);
  send({ type: 'push', samples: tone(2400) });
  out.started = await waitFor((s) => s.state === 'playing');
  // All text sent, audio still due, buffer runs dry: an underrun, then back to buffering.
  out.underrun = await waitFor((s) => s.underruns === 1 && s.state === 'buffering');

  send({ type: 'expect', value: false });
  send({ type: 'final', value: true });
  send({ type: 'push', samples: tone(1200) });  // below prebuffer, but final: plays out
  out.finalPlayed = await waitFor((s) => s.played === 6000 && s.state === 'idle');

  send({ type: 'final', value: false });  // a new turn: audio is coming again
  send({ type: 'push', samples: tone(6000) });
  out.replayed = await waitFor((s) => s.state === 'playing');
  out.waiting = await waitFor((s) => s.state === 'waiting');  // dry while waiting for text

  send({ type: 'push', samples: tone(48000) });
  await waitFor((s) => s.state === 'playing' && s.played > 12500);
  send({ type: 'clear' });
  out.cleared = await waitFor((s) => s.state === 'idle' && s.buffered === 0);
  await ctx.close();
  return out;
}"""


def test_jitter_buffer_states_and_counters(demo: Any) -> None:
    """Prebuffer holds audio, running dry while audio is due counts one underrun, clear drops the rest."""
    out = demo.page.evaluate(SCRIPT)
    assert out["held"]["played"] == 0 and out["held"]["state"] == "buffering"
    assert out["started"]["buffered"] <= 4800
    assert out["underrun"]["played"] == 4800 and out["underrun"]["underruns"] == 1
    assert out["finalPlayed"]["underruns"] == 1  # playing out the final audio is no underrun
    assert out["waiting"]["underruns"] == 1  # nor is waiting for text
    assert out["waiting"]["played"] == 12000
    cleared = out["cleared"]
    assert cleared["dropped"] > 0
    assert cleared["played"] + cleared["dropped"] == 12000 + 48000 == cleared["consumed"]
